"""Watching the node's own event loop: a step of any task that holds every other one up for
longer than `STALL` is a stall. Stalls are logged at WARNING, at most one line every
`LOG_EVERY`, saying how many there were and the longest: no client's work may stall the node
(README, "Limits"), and an operator should hear of it when something does.

It measures by sleeping `CHECK_EVERY` and reading the monotonic clock when it wakes: a late
wake-up is time the loop spent elsewhere. It runs in a node process only (the simulations' clocks
are virtual).
"""

from __future__ import annotations

import logging
import math
import time

import trio

log = logging.getLogger("sluicegate.stalls")

CHECK_EVERY = 0.01
STALL = 0.05
LOG_EVERY = 10.0


async def watch_stalls(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    stalls, longest, logged_at = 0, 0.0, -math.inf
    try:
        while True:
            before = time.monotonic()
            await trio.sleep(CHECK_EVERY)
            now = time.monotonic()
            late = now - before - CHECK_EVERY
            if late > STALL:
                stalls += 1
                longest = max(longest, late)
            if stalls and now >= logged_at + LOG_EVERY:
                _report(stalls, longest)
                stalls, longest, logged_at = 0, 0.0, now
    finally:
        if stalls:  # stopping: what the last line would have said
            _report(stalls, longest)


def _report(stalls: int, longest: float) -> None:
    log.warning(
        "The node's loop stalled %d times for over %.0f ms, the longest %.0f ms.",
        stalls,
        STALL * 1000,
        longest * 1000,
    )
