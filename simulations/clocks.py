"""Simulated nodes' clocks (node/clock.py's `Clock`): each node of a run has one of its own.

`SimClock` is trio's virtual time as a node sees it:

* **Rate** (the `skew` fault): node time = `origin + (trio time - origin) * rate`, so a node at
  rate 1.01 counts 1.01 s for every second of the run: its timers fire early (a node-second of
  sleep takes 1/rate trio seconds) and its durations read long. At rate 1 node time is trio
  time itself, float for float, so a run without skew schedules exactly as with `TrioClock`.
* **Freeze** (the `freeze` fault, as SIGSTOP): while frozen, no sleep of the node returns and no
  scope it made fires; their deadlines wait. At the thaw, what is overdue fires at once, and
  `now()` has jumped by the length of the freeze (monotonic clocks run on under SIGSTOP). The
  node's network traffic is held meanwhile (`SimNetwork.freeze`), so a task of the node that
  waits for bytes, or for another task of the node, does not run either.

Every scope made by `move_on_at`, `move_on_after` or `fail_after` (and so every sleep) is
registered with its deadline in node time while it is entered: that is what a freeze moves
out of reach and a thaw puts back.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import trio


class SimClock:
    def __init__(self, rate: float = 1.0, origin: float = 0.0) -> None:
        """`rate`: node seconds per trio second; `origin`: the trio time at which node time
        equals trio time (a machine's clock, whichever of its node's lives reads it)."""
        if not rate > 0:
            raise ValueError("a clock's rate must be positive")
        self.rate = rate
        self._origin = origin
        # Scopes this clock made, entered now: their deadlines in node time.
        self._gated: dict[trio.CancelScope, float] = {}
        self.frozen = False
        self._thawed: trio.Event | None = None

    # -- node time ---------------------------------------------------------------------------

    def now(self) -> float:
        now = trio.current_time()
        if self.rate == 1.0:
            return now
        return self._origin + (now - self._origin) * self.rate

    def trio_deadline(self, deadline: float) -> float:
        if self.rate == 1.0 or math.isinf(deadline):
            return deadline
        at = self._origin + (deadline - self._origin) / self.rate
        # Rounded up, so that a timer firing at `at` reads a node time of `deadline` or later
        # (else it would find nothing due, and fire again at once, for ever).
        while self._node_time(at) < deadline:
            at = math.nextafter(at, math.inf)
        return at

    def _node_time(self, trio_time: float) -> float:
        if self.rate == 1.0 or math.isinf(trio_time):
            return trio_time
        return self._origin + (trio_time - self._origin) * self.rate

    # -- waiting -----------------------------------------------------------------------------

    async def sleep_until(self, deadline: float) -> None:
        with self.move_on_at(deadline):
            await trio.sleep_forever()

    async def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("`seconds` must be non-negative")
        if seconds == 0:
            await trio.lowlevel.checkpoint()
        else:
            await self.sleep_until(self.now() + seconds)

    @contextmanager
    def move_on_at(self, deadline: float) -> Iterator[trio.CancelScope]:
        scope = trio.CancelScope(deadline=math.inf if self.frozen else self.trio_deadline(deadline))
        self._gated[scope] = deadline
        try:
            with scope:
                yield scope
        finally:
            del self._gated[scope]

    def move_on_after(self, seconds: float):
        if seconds < 0:
            raise ValueError("`seconds` must be non-negative")
        return self.move_on_at(self.now() + seconds)

    @contextmanager
    def fail_after(self, seconds: float) -> Iterator[trio.CancelScope]:
        with self.move_on_after(seconds) as scope:
            yield scope
        if scope.cancelled_caught:
            raise trio.TooSlowError

    def deadline_of(self, scope: trio.CancelScope) -> float:
        gated = self._gated.get(scope)
        return gated if gated is not None else self._node_time(scope.deadline)

    def reschedule(self, scope: trio.CancelScope, deadline: float) -> None:
        if scope in self._gated:
            self._gated[scope] = deadline
            if self.frozen:
                return
        scope.deadline = self.trio_deadline(deadline)

    # -- freezing ----------------------------------------------------------------------------

    def freeze(self) -> None:
        """From now on no timer of the node fires, until `thaw`."""
        if self.frozen:
            return
        self.frozen = True
        self._thawed = trio.Event()
        for scope in self._gated:
            scope.deadline = math.inf

    def thaw(self) -> None:
        """Timers run again: those overdue fire at once."""
        if not self.frozen:
            return
        self.frozen = False
        for scope, deadline in self._gated.items():
            scope.deadline = self.trio_deadline(deadline)
        self._thawed.set()

    async def thawed(self) -> None:
        """Return once the clock is not frozen."""
        if self.frozen:
            await self._thawed.wait()


# The true time of day at trio time 0 of a run whose nodes read the time of day (`wall`): a
# real one, so that eras, generations and windows have a real clock's magnitude (and its
# floats' resolution, a quarter of a microsecond).
TRUE_EPOCH = 1_800_000_000.0


class TimeOfDay:
    """A machine's time of day (the `wall` kind): it runs at real time's rate, as NTP keeps it,
    `offset` seconds from the run's true time of day, `TRUE_EPOCH` plus trio time; and it steps
    forwards or backwards when told to, in every life of the machine's node alike. `steps` is
    what it did, (trio time, by), for the checkers, which judge each node on its own clock."""

    def __init__(self, offset: float) -> None:
        self.offset = offset
        self.initial = offset
        self.steps: list[tuple[float, float]] = []

    def now(self) -> float:
        return TRUE_EPOCH + trio.current_time() + self.offset

    def step(self, by: float) -> None:
        self.offset += by
        self.steps.append((trio.current_time(), by))

    def offset_at(self, at: float) -> float:
        """The offset as it was at trio time `at`."""
        return self.initial + sum(by for when, by in self.steps if when <= at)
