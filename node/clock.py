"""A node's clock: the one place a node reads the time and waits for it.

Every timer of a node (leases, expiry, gossip ticks, retries) reads `now()` and waits with
`sleep` or `sleep_until`, in the node's own time. A process has one such clock, trio's
monotonic clock (`TrioClock`). The simulations run several nodes in one process and give each
a clock of its own (simulations/clocks.py): one that runs fast (clock-rate skew), or one that
stops the node's tasks while it is frozen (SIGSTOP).
"""

from __future__ import annotations

from typing import Protocol

import trio


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


TRIO_CLOCK = TrioClock()
