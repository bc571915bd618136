"""The simulations (`simulations/`): replays, sweeps, regression seeds, planted bugs, chaos."""
