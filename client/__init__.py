"""The sluicegate Python client."""
