"""Watching the node's own event loop: a stretch of more than `STALL` in which the loop runs
tasks without looking at its sockets is a stall. Stalls are logged at WARNING, at most one
line every `LOG_EVERY`, saying how many there were and the longest: no client's work may stall
the node (README, "Limits"), and an operator should hear of it when something does.

Trio looks at its sockets (its I/O wait) between every two batches of task steps; a trio
instrument (`StallWatch`) times each batch, from the end of one wait to the start of the next.
So a step that holds up every other task is measured whole, and an idle loop is never woken
for it: a task that slept 10 ms at a time and read the clock cost an idle node 2 % of a core.
It runs in a node process only (the simulations' clocks are virtual).
"""

from __future__ import annotations

import logging
import math
import time

import trio

log = logging.getLogger("sluicegate.stalls")

STALL = 0.05
LOG_EVERY = 10.0


class StallWatch(trio.abc.Instrument):
    """Counts the loop's batches of task steps longer than `STALL`, and logs them."""

    def __init__(self) -> None:
        self.stalls = 0
        self.longest = 0.0
        self._logged_at = -math.inf
        # When the batch running now began (NaN before the first wait ends: no batch).
        self._began = math.nan

    def after_io_wait(self, timeout: float) -> None:
        self._began = time.perf_counter()

    def before_io_wait(self, timeout: float) -> None:
        now = time.perf_counter()
        took = now - self._began
        if took > STALL:
            self.stalls += 1
            self.longest = max(self.longest, took)
        if self.stalls and now >= self._logged_at + LOG_EVERY:
            self.report()
            self._logged_at = now

    def report(self) -> None:
        """Log the stalls not logged yet, if any."""
        if self.stalls:
            log.warning(
                "The node's loop stalled %d times for over %.0f ms, the longest %.0f ms.",
                self.stalls,
                STALL * 1000,
                self.longest * 1000,
            )
        self.stalls, self.longest = 0, 0.0


async def watch_stalls(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Watch the loop until cancelled; then log what the last line would have said."""
    watch = StallWatch()
    trio.lowlevel.add_instrument(watch)
    task_status.started()
    try:
        await trio.sleep_forever()
    finally:
        trio.lowlevel.remove_instrument(watch)
        watch.report()
