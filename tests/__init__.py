"""The test suite, in folders that mirror the tiers (README, "Layout"); shared helpers here."""
