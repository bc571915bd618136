"""Acquires waiting at their home (`cluster/parked.py`): the ways in and out agree."""

from __future__ import annotations

import math

from sluicegate.cluster.parked import ParkedAcquires
from sluicegate.cluster.semaphore_ops import Acquire


def parked(*deadlines: float) -> ParkedAcquires:
    """Request i (from 1) of peer i % 3, due at `deadlines[i - 1]`."""
    acquires = ParkedAcquires()
    for request_id, deadline in enumerate(deadlines, start=1):
        acquire = Acquire(request_id % 3, "A", 1, block_for=deadline)
        acquires.park(request_id, acquire, deadline, undecided=False)
    return acquires


def test_the_first_taken_are_those_parked_longest_ago_and_the_rest_still_come_due():
    acquires = parked(5.0, 1.0, 4.0, 2.0, 3.0)
    assert [r.request_id for r in acquires.take_first(2)] == [1, 2]
    assert len(acquires) == 3 and [r.request_id for r in acquires.of_peer(1)] == [4]
    assert acquires.next_deadline() == 2.0
    assert [r.request_id for r in acquires.due(3.0)] == [4, 5]
    assert [r.request_id for r in acquires.take_first(10)] == [3]
    assert len(acquires) == 0 and acquires.next_deadline() == math.inf


def test_a_taken_acquire_comes_back_as_it_was_parked():
    acquires = parked(7.0)
    (request,) = acquires.take_first(1)
    assert (request.request_id, request.deadline, request.undecided) == (1, 7.0, False)
    assert request.op == Acquire(1, "A", 1, block_for=7.0)
    assert acquires.take_first(1) == [] and acquires.due(100.0) == []
