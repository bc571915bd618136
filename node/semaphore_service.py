"""Where a semaphore operation is served: here, or on the node that holds the state.

* `LocalSemaphores`: a single node serves everything from its own actor.
* `ClusterSemaphores`, the interim placement until semaphores are sharded (docs/cluster.md): all
  semaphore state lives on one node, the *authority*, and every node forwards every operation there,
  so any node answers any request correctly. Long polls wait at the authority and answer through
  the node the client talks to. The authority is the oldest live member, so a node that joins or
  restarts (always the youngest) never takes it over; it moves only when its holder dies or leaves.

The authority replicates its whole state to every other member it has a link to, at most every
`REPLICATION_INTERVAL` and only when something changed. A node that becomes the authority starts
from the latest replica it received, so holders keep their leases and waiters their places. Tokens
continue in an epoch above the replica's. Without a replica (a cold start, or a node too new to have
one) it starts empty, with the wall clock as the fencing epoch. If the cluster was already running
(a takeover), a grace period follows: nothing new is granted until it ends, because the replica may
miss the last moments and clients restore what it missed. When the authority moves away, this node
drops its state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import trio

from sluicegate.cluster.semaphore_ops import Acquire, Operation
from sluicegate.cluster.semaphores import Replica, SemaphoreConfig, SemaphoreCore, SemaphoreStats

from .links import Links
from .membership_actor import MembershipActor
from .rpc import Rpc, Unavailable
from .semaphore_actor import SemaphoreActor

log = logging.getLogger("sluicegate.semaphores")

# A forwarded call that gets no answer this long (plus its own block_for) answers 503.
FORWARD_TIMEOUT = 10.0
# How often this node looks at the members for a change of authority.
WATCH_INTERVAL = 0.1
# The authority sends a replica at most this often (and only after a change).
REPLICATION_INTERVAL = 0.2


def epoch_now() -> int:
    """Fencing epoch: wall-clock milliseconds, which grow from one authority to the next."""
    return time.time_ns() // 1_000_000


class LocalSemaphores:
    """A single node: everything is served here."""

    ready = True

    def __init__(self, actor: SemaphoreActor) -> None:
        self._actor = actor

    async def call(self, op: Operation) -> object:
        return await self._actor.call(op)

    async def stats(self) -> list[SemaphoreStats]:
        return await self._actor.stats()


class ClusterSemaphores:
    def __init__(
        self,
        actor: SemaphoreActor,
        semaphores: Mapping[str, SemaphoreConfig],
        membership: MembershipActor,
        rpc: Rpc,
        links: Links,
        *,
        settle: float,
        takeover_grace: float,
        cold_start_grace: float,
        settled_ticks: int,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self._actor = actor
        self._semaphores = dict(semaphores)
        self._membership = membership
        self._rpc = rpc
        self._links = links
        self._settle = settle
        self._takeover_grace = takeover_grace
        self._cold_start_grace = cold_start_grace
        self._settled_ticks = settled_ticks
        self._clock = clock
        self.ready = False
        self.serving = False  # this node is the authority and has its core set up
        self.forwarded = 0
        self.takeovers = 0
        # The latest replica from the authority, and when (by our clock) it arrived.
        self._replica: tuple[str, Replica, float] | None = None

    def authority(self) -> str | None:
        return self._membership.oldest_member()

    async def call(self, op: Operation) -> object:
        """Serve `op` wherever the state lives; `Unavailable` (503) while that is unknown."""
        if not self.ready:
            raise Unavailable("this node is still joining the cluster")
        authority = self.authority()
        if authority == self._membership.node_id:
            return await self.serve(op)
        timeout = FORWARD_TIMEOUT
        if isinstance(op, Acquire) and op.block_for:
            timeout += op.block_for
        self.forwarded += 1
        return await self._rpc.call(authority, op, timeout)

    async def serve(self, op: Operation) -> object:
        """Run `op` here, as the authority (also for calls forwarded by other nodes)."""
        if not self.serving or self.authority() != self._membership.node_id:
            raise Unavailable("this node does not hold the semaphores now")
        return await self._actor.call(op)

    async def stats(self) -> list[SemaphoreStats]:
        return await self._actor.stats()

    def receive_replica(self, sender: str, replica: Replica) -> None:
        """A replica arrived over a link; only the authority's count."""
        if sender == self.authority() and not self.serving:
            self._replica = (sender, replica, self._clock())

    @property
    def restores_beyond_max(self) -> int:
        return self._actor.restores_beyond_max

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Wait for membership to settle, then follow the authority as members change, and
        replicate while this node is it."""
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._replicate)
            await self._follow_authority()

    async def _replicate(self) -> None:
        sent_at_change = -1
        while True:
            await trio.sleep(REPLICATION_INTERVAL)
            if not self.serving or self._actor.changes == sent_at_change:
                continue
            sent_at_change = self._actor.changes
            await self._send_replica()

    async def hand_over(self, timeout: float) -> None:
        """Stopping: if this node holds the state, send a last replica (waiting at most
        `timeout` for it to leave), so the successor misses nothing of the last moments."""
        if self.serving:
            await self._send_replica()
            await self._links.flush(timeout)

    async def _send_replica(self) -> None:
        replica = await self._actor.replica()
        linked = self._links.status()
        for node_id in self._membership.live_members():
            # A replica is only worth its latest version: never queue one behind a down link.
            if linked.get(node_id):
                self._links.send(node_id, replica)

    async def _follow_authority(self) -> None:
        await trio.sleep(self._settle)
        self.ready = True
        me = self._membership.node_id
        previous = None
        while True:
            authority = self.authority()
            if authority == me and not self.serving:
                await self._take_over(cold=previous is None and not self._cluster_was_running())
            elif authority != me and self.serving:
                log.warning("Node %s holds the semaphores now; dropping ours.", authority)
                self.serving = False
                await self._actor.reset(SemaphoreCore(self._semaphores, epoch_now()))
            previous = authority
            await trio.sleep(WATCH_INTERVAL)

    async def _take_over(self, cold: bool) -> None:
        if self._replica is not None:
            maker, replica, received_at = self._replica
            # Rebased to when it arrived: the lifetimes it carries were counted from then.
            core = SemaphoreCore.from_replica(self._semaphores, replica, received_at, epoch_now())
            log.warning("Taking over from %s's replica: %d peers.", maker, len(replica.peers))
        else:
            core = SemaphoreCore(self._semaphores, epoch_now())
        self._replica = None
        grace = self._cold_start_grace if cold else self._takeover_grace
        if grace > 0:
            core.start_grace(self._clock() + grace)
        await self._actor.reset(core)
        self.serving = True
        if cold:
            log.info("This node holds the semaphores (cold start).")
        else:
            self.takeovers += 1
            log.warning(
                "This node took over the semaphores; %g s of grace for clients to restore.", grace
            )

    def _cluster_was_running(self) -> bool:
        """Were other members up well before this node? Their gossip heartbeat counts say so
        without comparing clocks: a heartbeat is one gossip interval of a member's life."""
        mine = self._membership.heartbeat_of(self._membership.node_id)
        return any(
            beats > mine + self._settled_ticks
            for node_id, beats in self._membership.heartbeats().items()
            if node_id != self._membership.node_id
        )
