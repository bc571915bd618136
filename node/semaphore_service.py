"""Where a semaphore operation is served: here, or on the node that holds its state.

* `LocalSemaphores`: a single node serves everything from its own actor.
* `ClusterSemaphores`: the semaphores are sharded over the members by the ring
  (docs/cluster.md). An operation on a peer goes to the peer's home, `GET /remainder` to the
  semaphore's owner, `POST /new_peer` stays here (this node draws an id homed here), and
  `GET /peers/` asks every member. The home asks the owners itself (`cluster/shard.py`), so a
  request crosses at most one link before its home, and long polls wait at the home and answer
  through the node the client talks to. While a node cannot serve something (its owner is unknown,
  unreachable, or its state is on the way), the answer is 503, which the stock client retries.

This module also feeds the core what it needs from the node: the members (checked every
`WATCH_INTERVAL`), and the moments to stream what changed in this node's share to the other
members (every `REPLICATION_INTERVAL`, and once more when it stops; `cluster/replica_stream.py`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import trio

from sluicegate.cluster.errors import NotServing
from sluicegate.cluster.ring import peer_key, semaphore_key
from sluicegate.cluster.semaphore_ops import (
    Acquire,
    Heartbeat,
    IsAcquired,
    ListPeers,
    NewPeer,
    Operation,
    ReleaseLock,
    ReleasePeer,
    Remainder,
    Restore,
)
from sluicegate.cluster.semaphores import SemaphoreStats
from sluicegate.cluster.shard import ShardCore

from .links import Links
from .membership_actor import MembershipActor
from .rpc import Rpc, Unavailable
from .semaphore_actor import Answered, SemaphoreActor

log = logging.getLogger("sluicegate.semaphores")

# A forwarded call that gets no answer this long (plus its own block_for) answers 503.
FORWARD_TIMEOUT = 10.0
# How often this node looks at the members for a change.
WATCH_INTERVAL = 0.1
# A node streams what changed in its share to the other members this often.
REPLICATION_INTERVAL = 0.2


def epoch_now() -> int:
    """Fencing epoch: wall-clock milliseconds, which grow from one owner to the next."""
    return time.time_ns() // 1_000_000


class LocalSemaphores:
    """A single node: everything is served here."""

    ready = True

    def __init__(self, actor: SemaphoreActor) -> None:
        self._actor = actor

    async def call(self, op: Operation) -> object:
        return await self._actor.call(op)

    def serves_here(self, op: Operation) -> bool:
        return True

    def submit(self, requests: list[tuple[Operation, Answered]]) -> None:
        """Apply operations now, each callback getting its outcome (`SemaphoreActor.submit`)."""
        self._actor.submit(requests)

    async def stats(self) -> list[SemaphoreStats]:
        return await self._actor.stats()


class ClusterSemaphores:
    def __init__(
        self,
        actor: SemaphoreActor,
        membership: MembershipActor,
        rpc: Rpc,
        links: Links,
        *,
        settle: float,
        settled_ticks: int,
        frozen_after: float = math.inf,
        clock: Callable[[], float] = trio.current_time,
        epoch: Callable[[], int] = epoch_now,
    ) -> None:
        self._actor = actor
        self._membership = membership
        self._rpc = rpc
        self._links = links
        self._settle = settle
        self._settled_ticks = settled_ticks
        self._frozen_after = frozen_after
        self._clock = clock
        self._epoch = epoch
        self._members_known = False
        self.forwarded = 0

    @property
    def core(self) -> ShardCore:
        return self._actor.core

    @property
    def node_id(self) -> str:
        return self._membership.node_id

    @property
    def ready(self) -> bool:
        """Does this node serve its share now (it knows the members, sees a majority of them,
        and has pulled its state)?"""
        return self._members_known and self.core.serving

    @property
    def takeovers(self) -> int:
        return self.core.takeovers

    @property
    def restores_beyond_max(self) -> int:
        return self._actor.restores_beyond_max

    async def call(self, op: Operation) -> object:
        """Serve `op` wherever its state lives; `Unavailable` (503) while that cannot be done."""
        if not self._members_known:
            raise Unavailable("this node is still joining the cluster")
        try:
            if isinstance(op, ListPeers):
                return await self._list_peers()
            target = self._target(op)
            if target is None or target == self._membership.node_id:
                return await self._actor.call(op)
            timeout = FORWARD_TIMEOUT
            if isinstance(op, Acquire) and op.block_for:
                timeout += op.block_for
            self.forwarded += 1
            return await self._rpc.call(target, op, timeout)
        except NotServing as error:
            raise Unavailable(error.reason) from None

    def serves_here(self, op: Operation) -> bool:
        """Is `op` served by this node's own actor (else `call` forwards it)?"""
        if not self._members_known or isinstance(op, ListPeers):
            return False
        target = self._target(op)
        return target is None or target == self._membership.node_id

    def submit(self, requests: list[tuple[Operation, Answered]]) -> None:
        """Apply operations this node serves now, each callback getting its outcome; a
        `NotServing` error means 503 (`SemaphoreActor.submit`)."""
        self._actor.submit(requests)

    async def serve(self, op: Operation) -> object:
        """Run `op` here, for another node (its core refuses what is not served here)."""
        return await self._actor.call(op)

    async def stats(self) -> list[SemaphoreStats]:
        """Throttle's gauges of the semaphores this node owns (each node reports its own)."""
        return await self._actor.stats()

    def _target(self, op: Operation) -> str | None:
        ring = self._membership.ring
        match op:
            case NewPeer():
                return None
            case Remainder(semaphore):
                return ring.owner(semaphore_key(semaphore))
            case Acquire() | ReleaseLock() | Heartbeat() | ReleasePeer() | IsAcquired() | Restore():
                return ring.owner(peer_key(op.peer_id))
        raise TypeError(f"not a semaphore operation: {op!r}")

    async def _list_peers(self) -> list[int]:
        peer_ids: list[int] = []
        for node_id in sorted(self._membership.live_members()):
            if node_id == self._membership.node_id:
                peer_ids.extend(await self._actor.call(ListPeers()))
            else:
                peer_ids.extend(await self._rpc.call(node_id, ListPeers(), FORWARD_TIMEOUT))
        return peer_ids

    # -- keeping the core informed -----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Wait for membership to settle, then tell the core of every change of the members,
        and replicate."""
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._replicate)
            nursery.start_soon(self._watch)
            await self._follow_members()

    async def _watch(self) -> None:
        """Tell the actor this process runs, so that it notices when it did not
        (`SemaphoreActor.watch`); a task of its own, never held up by the actor."""
        while True:
            self._actor.watch(self._clock(), self._frozen_after)
            await trio.sleep(WATCH_INTERVAL)

    async def _follow_members(self) -> None:
        await trio.sleep(self._settle)
        cold = not self._cluster_was_running()
        previous = None
        freezes = self._actor.freezes
        while True:
            if self._actor.freezes != freezes:
                # The actor stepped down on waking from a freeze: rejoin, as after a partition.
                freezes, previous = self._actor.freezes, None
            members = self._membership.generations()
            majority = self._membership.in_majority()
            if (members, majority) != previous:
                await self._actor.members_changed(
                    members, self._epoch(), cold, majority, self._membership.left_members()
                )
                if not majority:
                    log.warning(
                        "Members %s are no majority of the cluster: serving nothing until more "
                        "are back.",
                        ", ".join(sorted(members)),
                    )
                elif previous is not None:
                    log.info("Members now: %s.", ", ".join(sorted(members)))
                previous, cold = (members, majority), False
                self._members_known = True
            await trio.sleep(WATCH_INTERVAL)

    async def _replicate(self) -> None:
        while True:
            await trio.sleep(REPLICATION_INTERVAL)
            if self._members_known:
                await self._actor.replicate()

    async def hand_over(self, timeout: float) -> None:
        """Stopping: stream the last changes (waiting at most `timeout` for them to leave), so
        the successors miss nothing of the last moments."""
        if self._members_known:
            await self._actor.replicate()
            await self._links.flush(timeout)

    def _cluster_was_running(self) -> bool:
        """Were other members up well before this node? Their gossip heartbeat counts say so
        without comparing clocks: a heartbeat is one gossip interval of a member's life."""
        mine = self._membership.heartbeat_of(self._membership.node_id)
        return any(
            beats > mine + self._settled_ticks
            for node_id, beats in self._membership.heartbeats().items()
            if node_id != self._membership.node_id
        )
