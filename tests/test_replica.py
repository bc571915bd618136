"""A core rebuilt from a replica continues exactly where the original left off."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.cluster.errors import SemaphoreError
from sluicegate.cluster.replica_stream import ReplicaDelta
from sluicegate.cluster.semaphores import Replica, SemaphoreConfig, SemaphoreCore
from sluicegate.node.link_codec import LINK_CODEC

CONFIG = {
    "A": SemaphoreConfig(3, level=0),
    "B": SemaphoreConfig(5, level=1),
    "C": SemaphoreConfig(1, level=2),
}
NAMES = ["A", "B", "C"]

operation = st.one_of(
    st.tuples(st.just("acquire"), st.integers(0, 5), st.sampled_from(NAMES), st.integers(0, 4)),
    st.tuples(st.just("release"), st.integers(0, 5), st.sampled_from(NAMES)),
    st.tuples(st.just("delete"), st.integers(0, 5)),
    st.tuples(st.just("heartbeat"), st.integers(0, 5), st.integers(1, 30)),
    st.tuples(st.just("wait"), st.integers(1, 10)),
)


def run(core: SemaphoreCore, peers: list[int], op: tuple, now: float) -> tuple[object, float]:
    """Apply one operation; returns an observable outcome (result or error type) and the time."""
    kind = op[0]
    try:
        if kind == "acquire":
            return core.acquire(peers[op[1]], op[2], op[3], now), now
        if kind == "release":
            return core.release_lock(peers[op[1]], op[2]), now
        if kind == "delete":
            return core.release_peer(peers[op[1]]), now
        if kind == "heartbeat":
            return core.heartbeat(peers[op[1]], now + op[2]), now
        now += op[1]
        return core.expire(now), now
    except SemaphoreError as error:
        return type(error).__name__, now


def observe(core: SemaphoreCore, peers: list[int], now: float) -> tuple:
    acquired = []
    for peer in peers:
        try:
            acquired.append(core.is_acquired(peer))
        except SemaphoreError:
            acquired.append(None)
    stats = [(s.name, s.acquired, s.pending) for s in core.stats(now)]
    return (
        acquired,
        stats,
        [core.remainder(name) for name in NAMES],
        core.events(),
        core.next_deadline() - now if core.next_deadline() is not None else None,
    )


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    before=st.lists(operation, max_size=25),
    after=st.lists(operation, max_size=25),
)
def test_a_core_from_a_replica_behaves_like_the_original(seed, before, after):
    original = SemaphoreCore(CONFIG, epoch=1000)
    rng = random.Random(seed)
    peers = [original.new_peer(20, rng) for _ in range(6)]
    now = 0.0
    for op in before:
        _, now = run(original, peers, op, now)
    original.events()

    # Through the wire as a replica stream's first delta; the copy's clock is elsewhere.
    state = original.replica(now)
    [delta] = LINK_CODEC.decode(
        LINK_CODEC.encode([ReplicaDelta(0, True, state.peers, [], state.semaphores)])
    )
    replica = Replica(delta.peers, delta.semaphores)
    copy = SemaphoreCore.from_replica(CONFIG, replica, now + 1000, epoch=0)
    tokens_before = {(p, n): original.fencing_token(p, n) for p in peers for n in NAMES}

    for op in after:
        outcome, later = run(original, peers, op, now)
        copy_outcome, _ = run(copy, peers, op, now + 1000)
        assert outcome == copy_outcome, op
        now = later
        assert observe(original, peers, now) == observe(copy, peers, now + 1000)

    # Locks carried over keep their tokens; new grants in the copy are above every old token.
    highest_before = max((t for t in tokens_before.values() if t is not None), default=-1)
    for (peer, name), token in tokens_before.items():
        now_token = copy.fencing_token(peer, name)
        if now_token is not None and now_token != token:
            assert now_token > highest_before


def test_replicas_travel_between_nodes():
    core = SemaphoreCore(CONFIG, epoch=7)
    rng = random.Random(1)
    holder, waiter = core.new_peer(60, rng), core.new_peer(60, rng)
    core.acquire(holder, "C", 1, now=0)
    core.acquire(waiter, "C", 1, now=0)
    replica = core.replica(now=10)
    delta = ReplicaDelta(3, False, replica.peers, [holder], replica.semaphores)
    assert LINK_CODEC.decode(LINK_CODEC.encode([delta])) == [delta]
