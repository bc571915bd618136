"""Cluster cores: pure state machines (no I/O, no trio, no clock); `now` is always an argument."""
