"""Simulations of the cluster: many seeded runs of real nodes in one process (`run`), and chaos
with real processes. `python -m simulations --help`."""
