"""The node's watch on its own event loop (node/stall_watch.py)."""

import logging
import time

import trio

from sluicegate.node.stall_watch import watch_stalls


class IoWaits(trio.abc.Instrument):
    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


async def test_a_step_that_holds_the_loop_up_is_logged_as_a_stall(caplog):
    caplog.set_level(logging.WARNING, "sluicegate.stalls")
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_stalls)
        await trio.sleep(0.01)
        time.sleep(0.08)  # a step that blocks the loop
        await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    (record,) = [r for r in caplog.records if r.name == "sluicegate.stalls"]
    stalls, longest = record.args[0], record.args[2]
    assert stalls >= 1 and longest >= 80, record.getMessage()


async def test_the_watch_never_wakes_an_idle_loop(caplog):
    """A task that slept 10 ms at a time woke the loop 100 times a second, idle or not."""
    waits = IoWaits()
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_stalls)
        trio.lowlevel.add_instrument(waits)
        await trio.sleep(0.5)
        trio.lowlevel.remove_instrument(waits)
        nursery.cancel_scope.cancel()
    assert waits.count < 10
