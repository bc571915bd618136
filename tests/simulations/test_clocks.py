"""The simulated node clock (simulations/clocks.py) and the node code that waits on it: a clock
that runs fast or slow (the `skew` fault) and one that a freeze stops (the `freeze` fault).

pytest-trio only runs a test under a clock that the test itself asks for, hence
`autojump_clock` in every signature."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from simulations.clocks import SimClock
from sluicegate.cluster.semaphore_ops import Remainder
from sluicegate.node.clock import TRIO_CLOCK, Clock
from sluicegate.node.rpc import Rpc, Unavailable
from tests.node.test_rpc import Pair


async def test_a_fast_clock_counts_one_percent_more_and_its_timers_fire_early(autojump_clock):
    clock = SimClock(rate=1.01)
    start = clock.now()
    await trio.sleep(100)
    assert clock.now() - start == pytest.approx(101)
    began = trio.current_time()
    await clock.sleep(10.1)  # node seconds
    assert trio.current_time() - began == pytest.approx(10)
    began = trio.current_time()
    with clock.move_on_after(2.02):
        await trio.sleep_forever()
    assert trio.current_time() - began == pytest.approx(2)


async def test_a_slow_clock_counts_one_percent_less(autojump_clock):
    clock = SimClock(rate=0.99)
    start = clock.now()
    await trio.sleep(100)
    assert clock.now() - start == pytest.approx(99)
    began = trio.current_time()
    await clock.sleep_until(clock.now() + 9.9)
    assert trio.current_time() - began == pytest.approx(10)


async def test_at_rate_one_node_time_is_trio_time_float_for_float(autojump_clock):
    clock = SimClock()
    await trio.sleep(0.123456789)
    assert clock.now() == trio.current_time()
    assert clock.trio_deadline(1 / 3) == 1 / 3


async def test_a_frozen_clock_wakes_no_sleeper_until_the_thaw_then_the_overdue_at_once(
    autojump_clock,
):
    clock = SimClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper, "early", 2.0)
        nursery.start_soon(sleeper, "late", 20.0)
        await trio.sleep(1)
        clock.freeze()
        nursery.start_soon(sleeper, "during", 0.5)  # a timer set while frozen waits too
        await trio.sleep(9)
        assert woke == []
        assert clock.now() == pytest.approx(10)  # the time itself runs on, as under SIGSTOP
        clock.thaw()
    assert sorted(woke[:2]) == [("during", 10.0), ("early", 10.0)]
    assert woke[2] == ("late", 20.0)


async def test_a_frozen_clocks_scopes_do_not_fire_and_a_rescheduled_one_keeps_its_deadline(
    autojump_clock,
):
    clock = SimClock()
    ended: dict[str, float] = {}

    async def waiter(name: str, seconds: float, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with clock.move_on_after(seconds) as scope:
            task_status.started(scope)
            await trio.sleep_forever()
        ended[name] = trio.current_time()

    async with trio.open_nursery() as nursery:
        await nursery.start(waiter, "timeout", 1.0)
        moved = await nursery.start(waiter, "moved", 100.0)
        clock.freeze()
        clock.reschedule(moved, 5.0)
        assert clock.deadline_of(moved) == 5.0
        await trio.sleep(3)
        assert ended == {}
        clock.thaw()
        await trio.sleep(0)
    assert ended["timeout"] == 3.0
    assert ended["moved"] == 5.0


async def test_fail_after_raises_too_slow_in_node_time(autojump_clock):
    clock = SimClock(rate=2.0)
    with pytest.raises(trio.TooSlowError):
        with clock.fail_after(4):
            await trio.sleep(10)
    assert trio.current_time() == pytest.approx(2)


@pytest.mark.parametrize("clock", [TRIO_CLOCK, SimClock()])
async def test_every_clock_keeps_the_seam(autojump_clock, clock: Clock):
    began = trio.current_time()
    await clock.sleep(1.5)
    with clock.move_on_at(clock.now() + 1) as scope:
        clock.reschedule(scope, clock.now() + 2)
        assert clock.deadline_of(scope) == pytest.approx(clock.now() + 2)
        await trio.sleep_forever()
    assert trio.current_time() - began == pytest.approx(3.5)


async def test_rpc_timeouts_are_in_node_time_and_wait_out_a_freeze(autojump_clock, nursery):
    pair = Pair(nursery)
    nursery.start_soon(pair.nodes["a"].keep_linked, "b", "b")
    await trio.sleep(1)

    async def never(op):
        await trio.sleep_forever()

    pair.handler = never
    clock = SimClock(rate=2.0)
    rpc = pair.rpcs["a"] = Rpc(pair.nodes["a"], clock=clock)
    began = trio.current_time()
    with pytest.raises(Unavailable):
        await rpc.call("b", Remainder("A"), timeout=5)
    assert trio.current_time() - began == pytest.approx(2.5)

    async def thaw_later() -> None:
        await trio.sleep(7)
        clock.thaw()

    clock.freeze()
    nursery.start_soon(thaw_later)
    began = trio.current_time()
    with pytest.raises(Unavailable):
        await rpc.call("b", Remainder("A"), timeout=5)
    assert trio.current_time() - began == pytest.approx(7)


@pytest.mark.parametrize("rate", [1.01, 0.99, 1.0137])
async def test_a_timer_of_a_skewed_clock_reads_its_deadline_or_later_when_it_fires(
    autojump_clock, rate
):
    """Else a node's actor that wakes at a deadline finds nothing due, and wakes again at once
    without the virtual clock moving: a livelock (seen with skew, seed 3)."""
    clock = SimClock(rate, origin=0.5)
    rng = random.Random(1)
    for _ in range(200):
        deadline = clock.now() + rng.uniform(0.0, 3.0) + rng.random() * 1e-9
        await clock.sleep_until(deadline)
        assert clock.now() >= deadline
