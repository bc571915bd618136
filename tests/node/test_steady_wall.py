"""`SteadyWall` (node/clock.py), the clock rate limits decide on: the time of day, at its rate,
without its steps."""

from __future__ import annotations

import math

import pytest

from sluicegate.node.clock import SteadyWall


class Ticking:
    """A node clock that reads what the test sets."""

    def __init__(self, now: float) -> None:
        self.at = now

    def now(self) -> float:
        return self.at


@pytest.mark.parametrize("rate", [0.98, 1.0, 1.02])
def test_it_reads_the_time_of_day_at_its_rate_while_the_node_clock_runs_fast_or_slow(rate):
    node, wall = Ticking(50.0), [1_800_000_000.0]
    steady = SteadyWall(node, lambda: wall[0])
    for _ in range(100):
        node.at += 0.05 * rate
        wall[0] += 0.05
        assert steady.now() == wall[0]


@pytest.mark.parametrize("step", [3600.0, -3600.0, 0.5, -0.5])
def test_a_step_of_the_time_of_day_moves_it_by_nothing(step):
    node, wall = Ticking(50.0), [1_800_000_000.0]
    steady = SteadyWall(node, lambda: wall[0])
    node.at += 1.0
    wall[0] += 1.0
    before = steady.now()
    node.at += 0.25
    wall[0] += 0.25 + step
    assert steady.now() == pytest.approx(before + 0.25)  # the node clock's quarter second
    node.at += 1.0
    wall[0] += 1.0
    assert steady.now() == pytest.approx(before + 1.25)  # and the time of day's rate again


def test_it_never_runs_backward():
    node, wall = Ticking(0.0), [100.0]
    steady = SteadyWall(node, lambda: wall[0])
    readings = [steady.now()]
    for wall_step, node_step in [(-5.0, 0.0), (0.0, 0.1), (-0.01, 0.0), (0.2, 0.1), (-1.0, 1.0)]:
        wall[0] += wall_step
        node.at += node_step
        readings.append(steady.now())
    assert readings == sorted(readings)


def test_rounding_between_two_clocks_is_no_step():
    """A clock at another rate computed from the time of day (as a simulated one is) rounds
    differently at every reading; a waiter's sleeps at a window's edge read it an ulp apart."""
    wall = [4.0 - 1e-12]
    node = Ticking(0.0)
    steady = SteadyWall(node, lambda: wall[0])
    for _ in range(200):
        wall[0] = math.nextafter(wall[0], math.inf)
        node.at = 0.3 + (wall[0] - 0.3) * 1.01
        assert steady.now() == wall[0]
