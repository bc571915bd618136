"""A node's clock: the one place a node reads the time and waits for it.

Every timer of a node (leases, expiry, gossip ticks, retries, timeouts) reads `now()` and waits
with `sleep`, `sleep_until` or a cancel scope from `move_on_at`, `move_on_after` or `fail_after`,
in the node's own time. A process has one such clock, trio's monotonic clock (`TrioClock`). The
simulations run several nodes in one process and give each a clock of its own
(simulations/clocks.py): one that runs fast or slow (clock-rate skew), or one that stops the
node's tasks while it is frozen (SIGSTOP).

Rules for node code, so that a simulated clock can do both:

* read the time with `now()`, never `trio.current_time()`;
* wait with `sleep`, `sleep_until`, or a scope from `move_on_at`, `move_on_after`, `fail_after`
  (a frozen node's scopes do not fire until it thaws; overdue ones fire then);
* a scope's deadline is in the node's time: read it with `deadline_of(scope)` and move it with
  `reschedule(scope, deadline)`, never through `scope.deadline` (which is trio time, and which a
  freeze moves out of reach);
* `trio_deadline(deadline)` converts for a scope the clock does not make (one a library
  creates); a freeze does not hold such a scope.

For `TrioClock`, each of these is the trio call it stands for, so a node process behaves as it
did before the seam.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import trio

from sluicegate.cluster.slots import DRIFT_RATIO


class Clock(Protocol):
    def now(self) -> float:
        """The node's monotonic time, in seconds."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return at `deadline` of the node's time (at once if it has passed)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return `seconds` of the node's time from now."""
        ...

    def trio_deadline(self, deadline: float) -> float:
        """`deadline` of the node's time as trio time, for cancel scopes."""
        ...

    def move_on_at(self, deadline: float) -> AbstractContextManager[trio.CancelScope]:
        """A cancel scope (entered as a context manager) that ends at `deadline`, node time."""
        ...

    def move_on_after(self, seconds: float) -> AbstractContextManager[trio.CancelScope]:
        """A cancel scope that ends `seconds` of the node's time after it is entered (enter it
        at once: a simulated clock may count from the call)."""
        ...

    def fail_after(self, seconds: float) -> AbstractContextManager[trio.CancelScope]:
        """As `move_on_after`, raising `trio.TooSlowError` when the time runs out."""
        ...

    def deadline_of(self, scope: trio.CancelScope) -> float:
        """The deadline of a scope this clock made, in the node's time."""
        ...

    def reschedule(self, scope: trio.CancelScope, deadline: float) -> None:
        """Move the deadline of a scope this clock made to `deadline`, node time."""
        ...


class TrioClock:
    """trio's own clock: the node's time is trio time."""

    def now(self) -> float:
        return trio.current_time()

    async def sleep_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    def trio_deadline(self, deadline: float) -> float:
        return deadline

    def move_on_at(self, deadline: float) -> trio.CancelScope:
        return trio.move_on_at(deadline)

    def move_on_after(self, seconds: float) -> trio.CancelScope:
        return trio.move_on_after(seconds)

    def fail_after(self, seconds: float) -> AbstractContextManager[trio.CancelScope]:
        return trio.fail_after(seconds)

    def deadline_of(self, scope: trio.CancelScope) -> float:
        return scope.deadline

    def reschedule(self, scope: trio.CancelScope, deadline: float) -> None:
        scope.deadline = deadline


TRIO_CLOCK: Clock = TrioClock()


# What reading two clocks one after the other, or rounding, may put between them (a simulated
# clock at another rate computes its time from trio's): not a step. Taken for one, it moved
# `SteadyWall` off the time of day by a few ulps, and a window's edge with it, which a waiter
# then chased in ever smaller sleeps.
ROUNDING = 1e-6


class SteadyWall:
    """The time of day without its steps: what a node's rate limits decide on.

    It runs at the rate of the time of day (`wall`) while that stays within `slew` of the rate
    of the node's clock (by default as far as two clocks each within DRIFT of real time may
    differ, and the time of day runs within a hair of it while NTP slews it); across anything
    else (a step forward or back, by NTP or by hand) it runs at the node's clock's rate. So it
    never steps and never runs backward, as the node's clock, and a step of the time of day
    moves it by nothing; while the time of day has not stepped it reads the time of day, so
    windows are where the time of day puts them, on every node alike, and a node clock that
    runs fast or slow decides at the time of day's rate, not its own. What counts as a step is
    what runs beyond `slew` between two readings: read it often (the rate limits do at every
    gossip tick), and a step gets through by at most `slew` of the time between them."""

    def __init__(
        self, clock: Clock, wall: Callable[[], float], slew: float = DRIFT_RATIO - 1
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._slew = slew
        # The readings of both clocks last time (NaN before the first, which is then no step).
        self._then_clock = math.nan
        self._then_wall = math.nan
        # This clock less the time of day: 0 until the time of day steps.
        self._offset = 0.0

    def now(self) -> float:
        now, wall = self._clock.now(), self._wall()
        elapsed, walked = now - self._then_clock, wall - self._then_wall
        if abs(walked - elapsed) > self._slew * elapsed + ROUNDING:
            self._offset += elapsed - walked  # a step: go on at the node clock's rate
        self._then_clock, self._then_wall = now, wall
        return wall + self._offset
