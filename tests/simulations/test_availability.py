"""How the availability probe (simulations/availability.py) turns its ticks into figures per
fault: seconds some semaphore went unserved, and seconds until all were served for good."""

from __future__ import annotations

from simulations.availability import Probe
from simulations.history import Event


def probe(served: list[int]) -> Probe:
    """A probe of two semaphores (bits 1 and 2) that ran from 0 to 5 s with these ticks."""
    probe = Probe(None, ["n1"], ["A", "B"])
    probe.started, probe.stopped, probe.served = 0.0, 5.0, served
    return probe


def fault(at: float, kind: str) -> Event:
    return Event(at, "fault", "n1", detail=f"{kind} for 1.00s")


def test_each_fault_counts_its_ticks_until_the_next_fault():
    # Ticks every 0.1 s from 0: both served, A only, neither, both, both, B only, both.
    ticks = probe([3, 1, 0, 3, 3, 2, 3])
    assert ticks.window(0.05, 0.7) == (0.3, 0.55)
    assert ticks.by_fault([fault(0.1, "crash"), fault(0.45, "pause")]) == [
        ("crash", 0.2, 0.2),
        ("pause", 0.1, 0.15),
    ]


def test_a_fault_nothing_missed_in_counts_zero_and_no_fault_reports_nothing():
    assert probe([3, 3, 3]).by_fault([fault(0.0, "delay")]) == [("delay", 0.0, 0.0)]
    assert probe([3, 0, 3]).by_fault([]) == []
