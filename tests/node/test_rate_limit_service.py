"""Waiting for a rate limiter's go on one node, under trio's virtual clock: first come first
served, checks refused while callers wait, timeouts; and decisions on the node's clock, never
the time of day."""

from __future__ import annotations

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from sluicegate.cluster.errors import UnknownLimiter
from sluicegate.cluster.quota_leases import predecessor_hold
from sluicegate.cluster.rate_limits import (
    RateCheck,
    RateChecks,
    RateLimiterConfig,
    RateLimits,
    RateWait,
)
from sluicegate.cluster.ring import rate_key
from sluicegate.cluster.shard import SlotGained
from sluicegate.cluster.slots import Ballot, slot_of
from sluicegate.node.rate_limit_service import EVICT_INTERVAL, READ_INTERVAL, RateLimitService


@pytest.fixture
def service():
    configs = {"slow": RateLimiterConfig("token_bucket", 1, rate=1.0)}  # one per second
    return RateLimitService(RateLimits(configs))


async def test_waiters_are_admitted_first_come_first_served(autojump_clock, service, nursery):
    admitted = []

    async def wait(name: str, n: int = 1) -> None:
        decision = await service.call(RateWait("slow", "k", n, 100.0))
        assert decision.go
        admitted.append((name, trio.current_time()))

    with trio.fail_after(50):
        started = trio.current_time()
        for name in "abcd":
            nursery.start_soon(wait, name)
            await wait_all_tasks_blocked()
        await wait_all_tasks_blocked()
        assert service.waiting["slow"] == 3  # a went at once
        while len(admitted) < 4:
            await trio.sleep(0.5)
    assert [name for name, _ in admitted] == list("abcd")
    assert [round(at - started, 6) for _, at in admitted] == [0.0, 1.0, 2.0, 3.0]
    assert service.waiting["slow"] == 0


async def test_a_check_while_callers_wait_is_sorry_so_they_go_first(
    autojump_clock, service, nursery
):
    assert (await service.call(RateCheck("slow", "k", 1))).go
    nursery.start_soon(service.call, RateWait("slow", "k", 1, 100.0))
    await wait_all_tasks_blocked()
    await trio.sleep(0.9)
    sorry = await service.call(RateCheck("slow", "k", 1))
    assert not sorry.go and sorry.retry_after == pytest.approx(0.1)
    await trio.sleep(0.2)  # the waiter took the token at t=1
    assert not (await service.call(RateCheck("slow", "k", 1))).go
    await trio.sleep(1.0)
    assert (await service.call(RateCheck("slow", "k", 1))).go


async def test_a_repeated_check_is_decided_as_that_many_checks_in_a_row(
    autojump_clock, service, nursery
):
    decisions = await service.call(RateChecks("slow", "k", 1, 3))
    assert [d.go for d in decisions] == [True, False, False]
    await trio.sleep(1.0)
    nursery.start_soon(service.call, RateWait("slow", "k", 1, 100.0))
    await wait_all_tasks_blocked()
    await trio.sleep(0.5)
    # Behind a waiter, each of them is sorry too.
    assert [d.go for d in await service.call(RateChecks("slow", "k", 1, 2))] == [False, False]


async def test_a_wait_that_runs_out_of_time_is_sorry(autojump_clock, service):
    assert (await service.call(RateCheck("slow", "k", 1))).go
    started = trio.current_time()
    decision = await service.call(RateWait("slow", "k", 1, 0.5))
    assert not decision.go and trio.current_time() - started == pytest.approx(0.5)
    assert service.waiting["slow"] == 0
    assert (service.core.stats["slow"].go, service.core.stats["slow"].sorry) == (1, 1)
    with pytest.raises(UnknownLimiter):
        await service.call(RateWait("nope", "k", 1, 1.0))


async def test_a_retry_gets_the_go_its_first_try_got_and_takes_nothing(
    autojump_clock, service, nursery
):
    first = await service.call(RateCheck("slow", "k", 1, retry_id=1))
    assert first.go
    assert await service.call(RateCheck("slow", "k", 1, retry_id=1)) == first
    assert not (await service.call(RateCheck("slow", "k", 1, retry_id=2))).go
    await trio.sleep(1.0)
    # One of the checks asked at once is a retry: only the other two are decided.
    decisions = await service.call(RateChecks("slow", "k", 1, 3, retry_ids=(3, 1, 4)))
    assert [d.go for d in decisions] == [True, True, False] and decisions[1] == first

    # A wait sent twice: the copy waits behind the first, and gets its go once it went.
    answers = []

    async def wait() -> None:
        answers.append(await service.call(RateWait("slow", "k", 1, 100.0, retry_id=5)))

    nursery.start_soon(wait)
    await wait_all_tasks_blocked()
    nursery.start_soon(wait)
    await wait_all_tasks_blocked()
    assert service.waiting["slow"] == 2
    await trio.sleep(1.5)
    # (Decided anew, the copy would go at 3 s, when the next token comes.)
    assert len(answers) == 2 and answers[0].go and answers[0] == answers[1]
    await trio.sleep(0.5)
    assert (await service.call(RateCheck("slow", "k", 1))).go  # the copy took no token
    stats = service.core.stats["slow"]
    assert (stats.go, stats.repeated) == (4, 3)


@pytest.mark.parametrize("step", [3600.0, -3600.0])
async def test_lease_modes_hold_counts_on_the_nodes_clock_whatever_the_wall_clock_does(
    autojump_clock, step
):
    """A node that gains a slot holds its lease-mode keys' capacity back for the term of the
    slices its predecessor granted, by a clock that never steps: the time of day stepped an
    hour forward (or back) ends the hold no sooner (or later)."""
    configs = {"fetch": RateLimiterConfig("token_bucket", 10, rate=10.0, mode="lease", term=1.0)}
    stepped = [1_800_000_000.0]

    def wall() -> float:
        return stepped[0] + trio.current_time()

    service = RateLimitService(RateLimits(configs), wall=wall)
    check = RateCheck("fetch", "k", 1)
    gained = SlotGained(
        slot_of(rate_key("fetch", "k")), Ballot(8, 2, "n1"), Ballot(8, 1, "n2"), False
    )
    service.slots_changed([gained])
    assert not service.check_here(check).go
    stepped[0] += step
    await trio.sleep(predecessor_hold(1.0) - 0.01)
    assert not service.check_here(check).go  # still held, whatever the wall clock says
    await trio.sleep(0.15)  # the hold is over, and a token and a half came back since
    assert service.check_here(check).go
    assert not service.check_here(check).go


async def test_a_quiet_service_reads_the_time_of_day_every_quarter_second_and_no_more(
    autojump_clock, nursery
):
    """A step of the time of day is told from a slew by what runs beyond 4% between two
    readings, so the service reads it at least every `READ_INTERVAL` while no decision does;
    and, quiet, wakes for nothing else (each wake-up costs an idle member CPU)."""
    readings: list[float] = []

    def wall() -> float:
        readings.append(trio.current_time())
        return 1_800_000_000.0 + trio.current_time()

    configs = {"slow": RateLimiterConfig("token_bucket", 1, rate=1.0)}
    service = RateLimitService(RateLimits(configs), wall=wall)
    await nursery.start(service.run)
    await trio.sleep(30.0)
    gaps = [later - earlier for earlier, later in zip(readings, readings[1:], strict=False)]
    assert max(gaps) <= READ_INTERVAL + 1e-9
    assert len(readings) <= 30.0 / READ_INTERVAL + 30.0 / EVICT_INTERVAL + 2


async def test_go_events_are_taken_for_the_members_within_the_gossip_interval_of_the_first(
    autojump_clock, nursery
):
    configs = {"shared": RateLimiterConfig("token_bucket", 100, rate=1.0, mode="gossip")}
    service = RateLimitService(RateLimits(configs), gossip_interval=0.05)
    await nursery.start(service.run)
    await trio.sleep(1.0)
    for _ in range(2):  # the first go after a quiet time, and the next
        assert service.check_here(RateCheck("shared", "k", 1)).go
        assert service.core.events_waiting
        await trio.sleep(0.0501)
        assert not service.core.events_waiting
