"""The semaphore actor under trio's virtual clock: long polls, expiry wake-ups, shutdown.

pytest-trio only runs a test under a clock that the test itself asks for, hence `autojump_clock` in
every signature.
"""

from __future__ import annotations

import random

import pytest
import trio

from sluicegate.cluster.errors import UnknownPeer, UnknownSemaphore
from sluicegate.cluster.parked import STOP_CHUNK
from sluicegate.cluster.semaphore_ops import (
    Acquire,
    AcquireOutcome,
    IsAcquired,
    ListPeers,
    NewPeer,
    ReleaseLock,
    ReleasePeer,
    Remainder,
)
from sluicegate.cluster.semaphores import SemaphoreConfig, SemaphoreCore
from sluicegate.node.semaphore_actor import SemaphoreActor
from sluicegate.node.semaphore_service import listed_peers


@pytest.fixture
async def actor(nursery):
    actor = SemaphoreActor(
        SemaphoreCore({"A": SemaphoreConfig(1), "C": SemaphoreConfig(5)}), rng=random.Random(7)
    )
    await nursery.start(actor.run)
    yield actor
    actor.close()


async def test_blocked_acquire_answers_at_the_grant(autojump_clock, actor, nursery):
    holder = await actor.call(NewPeer(60))
    waiter = await actor.call(NewPeer(60))
    assert (await actor.call(Acquire(holder, "A", 1))).acquired is True

    async def release_later() -> None:
        await trio.sleep(3)
        await actor.call(ReleaseLock(holder, "A"))

    nursery.start_soon(release_later)
    started = trio.current_time()
    assert (await actor.call(Acquire(waiter, "A", 1, block_for=10))).acquired is True
    assert trio.current_time() - started == pytest.approx(3)


async def test_blocked_acquire_gives_up_after_block_for(autojump_clock, actor):
    holder = await actor.call(NewPeer(60))
    waiter = await actor.call(NewPeer(60))
    await actor.call(Acquire(holder, "A", 1))
    started = trio.current_time()
    assert (await actor.call(Acquire(waiter, "A", 1, block_for=5))).acquired is False
    assert trio.current_time() - started == pytest.approx(5)
    # The lock stays pending after the poll ran out.
    assert await actor.call(IsAcquired(waiter)) is False


async def test_actor_wakes_itself_at_the_next_expiry(autojump_clock, actor):
    holder = await actor.call(NewPeer(10))
    waiter = await actor.call(NewPeer(60))
    await actor.call(Acquire(holder, "A", 1))
    started = trio.current_time()
    # Nothing else happens: only the actor's own wake-up at t=10 can expire the holder (the
    # peers came after the actor went to sleep with no deadline: it must have been told).
    with trio.fail_after(1000):
        assert (await actor.call(Acquire(waiter, "A", 1, block_for=100))).acquired is True
    assert trio.current_time() - started == pytest.approx(10)
    with pytest.raises(UnknownPeer):
        await actor.call(IsAcquired(holder))


async def test_blocked_acquire_fails_when_its_peer_expires(autojump_clock, actor):
    holder = await actor.call(NewPeer(60))
    waiter = await actor.call(NewPeer(4))
    await actor.call(Acquire(holder, "A", 1))
    started = trio.current_time()
    with pytest.raises(UnknownPeer):
        await actor.call(Acquire(waiter, "A", 1, block_for=30))
    assert trio.current_time() - started == pytest.approx(4)


async def test_blocked_acquire_fails_when_its_peer_is_deleted(autojump_clock, actor, nursery):
    holder = await actor.call(NewPeer(60))
    waiter = await actor.call(NewPeer(60))
    await actor.call(Acquire(holder, "A", 1))

    async def delete_later() -> None:
        await trio.sleep(1)
        assert await actor.call(ReleasePeer(waiter)) is True

    nursery.start_soon(delete_later)
    with pytest.raises(UnknownPeer):
        await actor.call(Acquire(waiter, "A", 1, block_for=30))


async def test_domain_errors_reach_the_caller(autojump_clock, actor):
    peer = await actor.call(NewPeer(60))
    with pytest.raises(UnknownSemaphore):
        await actor.call(Acquire(peer, "nope", 1))
    # The actor keeps serving after an error.
    assert await actor.call(Remainder("A")) == 1


async def test_stop_blocking_answers_parked_acquires(autojump_clock, actor, nursery):
    holder = await actor.call(NewPeer(60))
    waiter = await actor.call(NewPeer(60))
    await actor.call(Acquire(holder, "A", 1))
    answers = []

    async def poll() -> None:
        answers.append(await actor.call(Acquire(waiter, "A", 1, block_for=1000)))

    nursery.start_soon(poll)
    await trio.testing.wait_all_tasks_blocked()
    started = trio.current_time()
    await actor.stop_blocking()
    await trio.testing.wait_all_tasks_blocked()
    assert answers == [AcquireOutcome(False)]
    assert trio.current_time() == started
    # After that, acquires answer at once instead of parking.
    assert (await actor.call(Acquire(waiter, "A", 1, block_for=1000))).acquired is False
    assert trio.current_time() == started


class Collected:
    def __init__(self) -> None:
        self.outcomes: dict[int, object] = {}

    def answered(self, key: int, result: object, error: BaseException | None) -> None:
        self.outcomes[key] = result if error is None else error


async def test_a_stop_answers_thousands_of_parked_acquires_in_chunks(autojump_clock, nursery):
    """Others run between the chunks: 20,000 answers in one step stalled the node 75 ms."""
    actor = SemaphoreActor(SemaphoreCore({"A": SemaphoreConfig(1)}), rng=random.Random(7))
    await nursery.start(actor.run)
    collected = Collected()
    peers = [await actor.call(NewPeer(600)) for _ in range(STOP_CHUNK * 5 // 2 + 1)]
    holder, waiters = peers[0], peers[1:]
    await actor.call(Acquire(holder, "A", 1))
    actor.submit([(Acquire(p, "A", 1, block_for=600), i) for i, p in enumerate(waiters)], collected)
    assert collected.outcomes == {}
    seen: list[int] = []
    stopped = trio.Event()

    async def watch() -> None:
        while not stopped.is_set():
            seen.append(len(collected.outcomes))
            await trio.sleep(0)

    nursery.start_soon(watch)
    await actor.stop_blocking()
    stopped.set()
    assert set(collected.outcomes.values()) == {AcquireOutcome(False)}
    assert len(collected.outcomes) == len(waiters)
    assert {STOP_CHUNK, 2 * STOP_CHUNK} <= set(seen)
    assert len(actor._parked) == 0 and len(actor._parked._deadlines) == 0
    actor.close()


async def test_many_concurrent_callers_are_served_in_arrival_order(autojump_clock, actor):
    peers = [await actor.call(NewPeer(600)) for _ in range(50)]
    granted: list[int] = []

    # Each asks for the full count, so grants happen one per release and their order is visible
    # (trio shuffles the wake-up order of tasks that become runnable in the same step).
    async def take(peer: int) -> None:
        assert (await actor.call(Acquire(peer, "C", 5, block_for=600))).acquired is True
        granted.append(peer)
        await trio.sleep(1)
        await actor.call(ReleaseLock(peer, "C"))

    async with trio.open_nursery() as nursery:
        for peer in peers:
            nursery.start_soon(take, peer)
            await trio.testing.wait_all_tasks_blocked()
    assert granted == peers
    assert await actor.call(Remainder("C")) == 5


async def test_stats_report_waiting_time(autojump_clock, actor, nursery):
    holder = await actor.call(NewPeer(60))
    waiter = await actor.call(NewPeer(60))
    await actor.call(Acquire(holder, "A", 1))
    await actor.call(Acquire(waiter, "A", 1))
    await trio.sleep(7.5)
    stats = {s.name: s for s in await actor.stats()}
    assert stats["A"].acquired == 1
    assert stats["A"].pending == 1
    assert stats["A"].longest_pending == pytest.approx(7.5)


async def test_grants_carry_strictly_increasing_fencing_tokens(autojump_clock, actor, nursery):
    tokens = []
    for _ in range(5):
        peer = await actor.call(NewPeer(60))
        outcome = await actor.call(Acquire(peer, "A", 1))
        assert outcome.acquired
        tokens.append(outcome.fencing_token)
        # Asking again for the held lock answers with the same token.
        assert (await actor.call(Acquire(peer, "A", 1))).fencing_token == outcome.fencing_token
        await actor.call(ReleasePeer(peer))
    assert tokens == sorted(set(tokens))

    # A waiter granted by a release gets the next token through its long poll.
    holder = await actor.call(NewPeer(60))
    held = await actor.call(Acquire(holder, "A", 1))
    waiter = await actor.call(NewPeer(60))

    async def release_later() -> None:
        await trio.sleep(1)
        await actor.call(ReleaseLock(holder, "A"))

    nursery.start_soon(release_later)
    outcome = await actor.call(Acquire(waiter, "A", 1, block_for=10))
    assert outcome.acquired
    assert outcome.fencing_token > held.fencing_token > tokens[-1]


async def test_pending_answers_carry_no_token(autojump_clock, actor):
    holder = await actor.call(NewPeer(60))
    waiter = await actor.call(NewPeer(60))
    await actor.call(Acquire(holder, "A", 1))
    assert await actor.call(Acquire(waiter, "A", 1)) == AcquireOutcome(False, None)


async def test_a_cancelled_wait_is_withdrawn_from_the_actor(autojump_clock, actor, nursery):
    holder = await actor.call(NewPeer(600))
    waiter = await actor.call(NewPeer(600))
    await actor.call(Acquire(holder, "A", 1))
    with trio.move_on_after(1):
        await actor.call(Acquire(waiter, "A", 1, block_for=300))
    assert len(actor._parked) == 0 and len(actor._askers) == 0
    # Withdrawn deadlines are dropped, not kept until they come.
    for _ in range(100):
        with trio.move_on_after(0.01):
            await actor.call(Acquire(waiter, "A", 1, block_for=300))
    assert len(actor._parked._deadlines) < 10


async def test_withdraw_forgets_only_its_owners_waits(autojump_clock, actor, nursery):
    holder = await actor.call(NewPeer(600))
    waiter = await actor.call(NewPeer(600))
    await actor.call(Acquire(holder, "A", 1))
    answers = []

    class Asker:
        def __init__(self, name: str) -> None:
            self.name = name

        def answered(self, key, result, error) -> None:
            answers.append((self.name, key))

    connection, other = Asker("gone"), Asker("kept")
    actor.submit([(Acquire(waiter, "A", 1, block_for=30), 7)], connection)
    actor.submit([(Acquire(waiter, "A", 1, block_for=30), 8)], other)
    actor.withdraw(connection)
    await actor.call(ReleaseLock(holder, "A"))
    await trio.testing.wait_all_tasks_blocked()
    assert answers == [("kept", 8)]


async def test_many_peers_expire_in_steps_of_a_thousand(autojump_clock, actor, caplog):
    for _ in range(3500):
        await actor.call(NewPeer(10))
    others = await actor.call(NewPeer(60))
    await trio.sleep(11)
    removed = [r.getMessage() for r in caplog.records if "due to expiration" in r.getMessage()]
    assert removed == [f"Removed {n} peers due to expiration." for n in (1000, 1000, 1000, 500)]
    assert await actor.call(IsAcquired(others)) is True
    assert actor.core.peer_ids() == [others]


async def test_peers_are_listed_a_page_at_a_time_and_as_many_as_asked():
    """A range with more than a page of peers is split and asked again: every peer comes once,
    and no answer is longer than a page, whatever the ids (a restore may choose them)."""
    rng = random.Random(7)
    ids = {rng.getrandbits(64) for _ in range(200)} | {5, 6, 7, 2**64 - 1}
    asked = []

    async def ask(op: ListPeers) -> list[int] | None:
        asked.append(op)
        found = [peer_id for peer_id in ids if op.low <= peer_id <= op.high]
        return found if len(found) <= 3 else None

    listed = await listed_peers(ask, None)
    assert sorted(listed) == sorted(ids)
    assert len(asked) < 4 * len(ids)
    assert len(await listed_peers(ask, 10)) == 10
