"""Two semaphore actors running sharded cores, joined by in-memory links, under trio's virtual
clock: an acquire at a peer's home waits for the owner on the other node, long polls answer at
grants that come over the link, and an owner that never answers leaves "not yet".
"""

from __future__ import annotations

import random

import pytest
import trio

from sluicegate.cluster.errors import NotServing
from sluicegate.cluster.semaphore_ops import Acquire, IsAcquired, NewPeer, ReleaseLock
from sluicegate.cluster.semaphores import SemaphoreConfig
from sluicegate.cluster.shard import ShardCore
from sluicegate.node.semaphore_actor import DECISION_TIMEOUT, SemaphoreActor

CONFIG = {name: SemaphoreConfig(1) for name in "ABCDEFGH"}


class Pair:
    """Actors n1 and n2; what one sends reaches the other, unless `cut` is set."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.cut = False
        self.actors: dict[str, SemaphoreActor] = {}
        for node_id in ("n1", "n2"):
            core = ShardCore(
                node_id,
                CONFIG,
                rng=random.Random(node_id),
                epoch=1,
                settle=1.0,
                takeover_grace=0.0,
                cold_start_grace=0.0,
                pull_retry=1.0,
            )
            self.actors[node_id] = SemaphoreActor(
                core, rng=random.Random(node_id), send=self._sender(node_id)
            )

    def _sender(self, node_id: str):
        def send(destination: str, message: object, generation: int | None) -> None:
            if not self.cut:
                self.nursery.start_soon(self.actors[destination].deliver, node_id, message)

        return send

    async def start(self) -> None:
        for actor in self.actors.values():
            await self.nursery.start(actor.run)
        for actor in self.actors.values():
            await actor.members_changed({"n1": 1, "n2": 1}, epoch=2, cold=True, majority=True)
        await trio.sleep(0.1)  # the pulls are answered

    def owned_by(self, node_id: str) -> str:
        """A semaphore that node owns."""
        core = self.actors[node_id].core
        return next(name for name in CONFIG if core.owner_of(name) == node_id)


@pytest.fixture
async def pair(nursery):
    pair = Pair(nursery)
    await pair.start()
    yield pair
    for actor in pair.actors.values():
        actor.close()


async def test_an_acquire_waits_for_the_owner_on_the_other_node(autojump_clock, pair):
    home = pair.actors["n1"]
    name = pair.owned_by("n2")
    peer = await home.call(NewPeer(60))
    started = trio.current_time()
    outcome = await home.call(Acquire(peer, name, 1))
    assert outcome.acquired is True and outcome.fencing_token is not None
    assert trio.current_time() - started < 0.1
    with pytest.raises(NotServing):  # the other node is not this peer's home
        await pair.actors["n2"].call(IsAcquired(peer))


async def test_a_queued_lock_answers_not_yet_as_soon_as_the_owner_says_so(autojump_clock, pair):
    home = pair.actors["n1"]
    name = pair.owned_by("n2")
    holder, waiter = await home.call(NewPeer(60)), await home.call(NewPeer(60))
    assert (await home.call(Acquire(holder, name, 1))).acquired is True
    started = trio.current_time()
    assert (await home.call(Acquire(waiter, name, 1))).acquired is False
    assert trio.current_time() - started < 0.1


async def test_a_long_poll_answers_when_the_grant_comes_over_the_link(
    autojump_clock, pair, nursery
):
    name = pair.owned_by("n2")
    holder_home, waiter_home = pair.actors["n2"], pair.actors["n1"]
    holder = await holder_home.call(NewPeer(60))
    waiter = await waiter_home.call(NewPeer(60))
    assert (await holder_home.call(Acquire(holder, name, 1))).acquired is True

    async def release_later() -> None:
        await trio.sleep(3)
        await holder_home.call(ReleaseLock(holder, name))

    nursery.start_soon(release_later)
    started = trio.current_time()
    outcome = await waiter_home.call(Acquire(waiter, name, 1, block_for=10))
    assert outcome.acquired is True
    assert trio.current_time() - started == pytest.approx(3, abs=0.1)


async def test_without_an_answer_from_the_owner_the_lock_stays_pending(autojump_clock, pair):
    home = pair.actors["n1"]
    name = pair.owned_by("n2")
    peer = await home.call(NewPeer(60))
    pair.cut = True
    started = trio.current_time()
    assert (await home.call(Acquire(peer, name, 1))).acquired is False
    assert trio.current_time() - started == pytest.approx(DECISION_TIMEOUT, abs=0.1)
    assert await home.call(IsAcquired(peer)) is False
    pair.cut = False  # the home asks again until the owner answers
    await trio.sleep(2)
    assert await home.call(IsAcquired(peer)) is True
