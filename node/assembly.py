"""One node, wired in one place: what a node process runs (node/server.py) and what the
simulations run (simulations/cluster.py).

`Node(config, address, seams)` builds every part before anything runs: a single node's
semaphore actor, or a cluster node's membership, links, slot ownership, shard and forwarding;
its rate limits; and the app that shells requests to them. Three verbs then: `run` its tasks
(the ports are the caller's: a process's listener, the simulated network), `leave` as on
SIGTERM (answer waiting acquires, hand slots and rate-limit keys on, say goodbye), and `close`
once nothing is served any more.

What differs between a process and a simulation is only what `Seams` carries: how links are
dialled, the random source, the life's generation, the clock of eras and fencing epochs, the
node's own clock, the time of day whose rate (never its steps) rate limits decide at, and
whether a link repeats a message (the simulations' duplicating network).
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from sluicegate.cluster.auth import Credentials
from sluicegate.cluster.dns_seeds import DnsSeeds, is_dns_entry, parse_dns_entry
from sluicegate.cluster.membership import Gossip, Membership
from sluicegate.cluster.ownership import Ownership
from sluicegate.cluster.peers import raise_tickets
from sluicegate.cluster.rate_limits import RateEvents, RateHandover, RateLimits, RateOperation
from sluicegate.cluster.semaphores import SemaphoreCore
from sluicegate.cluster.shard import Shard
from sluicegate.cluster.slots import takeover_bound

from .app import NodeApp
from .clock import TRIO_CLOCK, Clock
from .cluster_admin import ClusterAdmin
from .cluster_status import MemberStatuses, members_status
from .config import NodeConfig, definitions_digest
from .dns_discovery import DnsDiscovery, dns_resolver
from .gc_pauses import GC_PAUSES
from .latencies import LatencyCollector
from .link_codec import LINK_CODEC
from .links import Dialer, Links, websocket_dialer
from .membership_actor import MembershipActor
from .node_metrics import ClusterCollector, NodeMetrics, RateLimitCollector
from .rate_limit_service import MemberReach, RateLimitService
from .rpc import Call, Failure, Reply, Rpc
from .semaphore_actor import SemaphoreActor
from .semaphore_service import ClusterSemaphores, LocalSemaphores, epoch_now
from .shard_actor import ShardActor
from .state_file import Kept, StateFile

log = logging.getLogger("sluicegate.node")

# A stopping node hands its slots on for at most this long before it says goodbye.
HAND_ON_TIMEOUT = 1.0
# ... and waits at most this long for the members it handed rate-limit keys to.
RATE_HAND_ON_TIMEOUT = 0.3


@dataclass(frozen=True)
class Seams:
    """What a node is built with besides its configuration; the defaults are a process's."""

    dialer: Dialer = websocket_dialer
    # Peer ids and handshake nonces must not be guessable from the ones seen: the system's
    # source, unless a simulation's seed.
    rng: random.Random | None = None
    # This life's number among the node's lives (default: the wall clock, which orders them).
    generation: int | None = None
    # The clock of the cluster's eras and of fencing epochs.
    epoch: Callable[[], int] = epoch_now
    clock: Clock = TRIO_CLOCK
    # The time of day: rate limits decide at its rate and on its windows, never its steps.
    wall: Callable[[], float] = time.time
    # Whether a link sends a message a second time (never, but in a duplicating simulation):
    # `repeat(remote_id, message, remote_life)`.
    repeat: Callable[[str, object, int | None], bool] | None = None


class Node:
    def __init__(
        self,
        config: NodeConfig,
        address: str,
        seams: Seams = Seams(),
        *,
        credentials: Credentials | None = None,
        client_tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        """A node reachable at `address` (host:port); `credentials`: the tokens of a node with
        `[auth]`; `client_tls`: the context this node dials the others with, if it runs TLS."""
        self.config = config
        limits = config.limits
        cluster = config.cluster
        self.node_id = (cluster.node_id or address) if cluster.secret else address
        self._rng = rng = seams.rng or random.SystemRandom()
        self._seams = seams
        self._nursery: trio.Nursery | None = None
        # Set by `POST /drain` (node/cluster_admin.py), or once the others forgot this life:
        # the node's runner stops it as on SIGTERM.
        self.drain_asked, self.forgotten = trio.Event(), trio.Event()
        self.metrics = NodeMetrics()
        self._actor: SemaphoreActor | None = None
        self._cluster: _ClusterParts | None = None
        # This life's generation, in a cluster: what its members know it by.
        self.generation: int | None = None
        reach = None
        self.membership: MembershipActor | None = None
        secret = cluster.secret.encode() if cluster.secret else b""
        if secret:
            self._cluster = parts = self._build_cluster(address, secret, client_tls)
            self.membership = parts.membership_actor
            reach = MemberReach(parts.ownership, parts.membership_actor, parts.rpc, parts.links)
        self.rate_limits = RateLimitService(
            RateLimits(config.rate_limits, self.node_id if reach else "", rng, limits),
            gossip_interval=cluster.rate_gossip_interval,
            node_clock=seams.clock,
            wall=seams.wall,
            members=reach,
        )
        if self._cluster is not None:
            parts = self._cluster
            parts.shard_actor = ShardActor(
                parts.shard,
                send_together=parts.links.send_together,
                on_slot_changes=self.rate_limits.slots_changed,
                keep_era=parts.keep_era,
                on_claims=parts.membership_actor.claim,
                clock=seams.clock,
            )
            self.semaphores: LocalSemaphores | ClusterSemaphores = ClusterSemaphores(
                parts.shard_actor,
                parts.membership_actor,
                parts.rpc,
                takeover=takeover_bound(cluster.down_after, parts.ownership.lease),
                limits=limits,
                clock=seams.clock,
            )
            parts.semaphores = self.semaphores
            self.metrics.registry.register(
                ClusterCollector(parts.membership_actor, parts.links, self.semaphores)
            )
        else:
            # Fencing tokens continue above this node's previous life: its start orders them,
            # and the epoch it kept, with a state directory, whatever the clock says now.
            epoch = seams.epoch()
            if cluster.state_dir:
                state = StateFile(Path(cluster.state_dir))
                kept = state.read()
                epoch = max(epoch, kept.era + 1)
                state.write(Kept(epoch, kept.generation))
            core = SemaphoreCore(config.semaphores, epoch=epoch, limits=limits)
            self._actor = SemaphoreActor(core, rng=rng, limits=limits)
            self.semaphores = LocalSemaphores(self._actor, limits)
        if config.rate_limits:  # none configured: /metrics stays exactly Throttle's
            self.metrics.registry.register(RateLimitCollector(self.rate_limits))
        admin = None
        if self._cluster is not None:
            admin = ClusterAdmin(
                self.node_id, secret, self._cluster.membership_actor, self.drain_asked
            )
        self.app = NodeApp(
            self.semaphores,
            self.rate_limits,
            node_id=self.node_id,
            extra_metrics=self.metrics.render,
            limits=limits,
            credentials=credentials,
            links=self._cluster.links if self._cluster else None,
            member_statuses=(
                MemberStatuses(partial(members_status, tls=client_tls)) if client_tls else None
            ),
            cluster_admin=admin,
        )
        if config.rate_limits or cluster.secret:
            self.metrics.registry.register(LatencyCollector(self.app.latencies))
            self.metrics.registry.register(GC_PAUSES)

    def _build_cluster(
        self, address: str, secret: bytes, client_tls: Callable[[], ssl.SSLContext] | None
    ) -> _ClusterParts:
        config, seams, rng, node_id = self.config, self._seams, self._rng, self.node_id
        cluster = config.cluster
        # A new generation per start: the wall clock orders this node's own lives, and what
        # the last life kept, if anything, keeps that order when the clock stepped back.
        state = StateFile(Path(cluster.state_dir)) if cluster.state_dir else None
        kept = state.read() if state is not None else Kept()
        generation = time.time_ns() if seams.generation is None else seams.generation
        self.generation = generation = max(generation, kept.generation + 1)
        if state is not None:
            state.write(Kept(kept.era, generation))
        dialer = seams.dialer
        if client_tls is not None and dialer is websocket_dialer:
            dialer = partial(websocket_dialer, tls=client_tls)
        links = Links(
            node_id,
            secret,
            LINK_CODEC,
            dialer,
            self._deliver,
            rng,
            generation,
            on_link_down=self._link_down,
            clock=seams.clock,
            repeat=seams.repeat,
            life_of=self._life_of,
        )
        membership = Membership(
            node_id,
            address,
            generation,
            [entry for entry in cluster.join if not is_dns_entry(entry)],
            down_after=cluster.down_after,
            definitions=definitions_digest(config),
        )
        rpc = Rpc(links, clock=seams.clock, news_twice_at=membership.advanced_twice_at)
        membership_actor = MembershipActor(
            membership,
            links,
            interval=cluster.gossip_interval,
            rng=rng,
            clock=seams.clock,
            # Calls forwarded to a member counted down fail at once: its slots move on.
            on_member_down=rpc.link_down,
            on_change=self._members_changed,
            on_forgotten=self.forgotten.set,
        )
        ownership = Ownership(
            node_id,
            life=generation,
            lease=cluster.lease or cluster.down_after,
            settle=cluster.down_after,
            era_floor=max(seams.epoch(), kept.era + 1),
            rng=rng,
            now=seams.clock.now(),
            adopted=raise_tickets,
        )
        shard = Shard(
            node_id,
            config.semaphores,
            ownership,
            rng,
            cold_start_grace=cluster.cold_start_grace,
            limits=config.limits,
        )
        dns_names = [parse_dns_entry(entry) for entry in cluster.join if is_dns_entry(entry)]
        discovery = DnsDiscovery(
            DnsSeeds(dns_names, address),
            dns_resolver(cluster.resolver),
            membership_actor.use_found_seeds,
            clock=seams.clock,
        )

        def keep_era(era: int) -> None:
            if state is not None:
                state.write(Kept(era, generation))

        return _ClusterParts(
            links,
            membership_actor,
            rpc,
            ownership,
            shard,
            discovery if dns_names else None,
            keep_era,
        )

    # -- the three verbs ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the node's tasks until cancelled; started once it serves (a cluster node: once
        it has begun to join)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self._actor is not None:
                await nursery.start(self._actor.run)
            await nursery.start(self.rate_limits.run)
            parts = self._cluster
            if parts is not None:
                assert parts.shard_actor is not None and parts.semaphores is not None
                log.info(
                    "Node %s joining the cluster through %s.",
                    self.node_id,
                    ", ".join(self.config.cluster.join) or "-",
                )
                await nursery.start(parts.shard_actor.run)
                await nursery.start(parts.membership_actor.run)
                if parts.discovery is not None:
                    await nursery.start(parts.discovery.run)
                await nursery.start(parts.semaphores.run)
            task_status.started()

    async def leave(self) -> None:
        """Stop as on SIGTERM: waiting acquires answered, then in a cluster the slots and the
        rate-limit keys handed on, and a goodbye."""
        if self._actor is not None:
            await self._actor.stop_blocking()
        parts = self._cluster
        if parts is not None:
            assert parts.semaphores is not None
            await parts.semaphores.leave(timeout=HAND_ON_TIMEOUT)
            await self.rate_limits.leave(timeout=RATE_HAND_ON_TIMEOUT)
            await parts.membership_actor.leave()

    def close(self) -> None:
        """Nothing is served any more: the actors may end."""
        if self._actor is not None:
            self._actor.close()

    # -- what the links deliver -------------------------------------------------------------

    async def _deliver(self, remote_id: str, messages: list[object]) -> None:
        parts, nursery = self._cluster, self._nursery
        # Links deliver only once the node runs, with every part built.
        assert parts is not None and parts.shard_actor is not None and nursery is not None
        for message in messages:
            if isinstance(message, Gossip):
                parts.membership_actor.receive(message)
            elif isinstance(message, Call):
                serve = self.rate_limits.serve if isinstance(message.op, RateOperation) else None
                handler = serve or parts.shard_actor.call
                nursery.start_soon(parts.rpc.serve, remote_id, message, handler)
            elif isinstance(message, RateEvents):
                self.rate_limits.receive(message)
            elif isinstance(message, RateHandover):
                self.rate_limits.handed_over(message)
            elif isinstance(message, Reply | Failure):
                parts.rpc.answered(message)
            else:
                parts.shard_actor.deliver(remote_id, message)
        parts.shard_actor.flush()

    def _life_of(self, node_id: str) -> int | None:
        return self._cluster.membership_actor.generation_of(node_id) if self._cluster else None

    def _link_down(self, remote_id: str) -> None:
        if self._cluster is not None:
            self._cluster.rpc.link_down(remote_id)

    def _members_changed(self) -> None:
        if self._cluster is not None and self._cluster.semaphores is not None:
            self._cluster.semaphores.follow_members()


@dataclass
class _ClusterParts:
    links: Links
    membership_actor: MembershipActor
    rpc: Rpc
    ownership: Ownership
    shard: Shard
    discovery: DnsDiscovery | None
    # Keeps the ownership's era on disk, with `[cluster] state_dir`.
    keep_era: Callable[[int], None]
    # Built once the rate limits are (their slot changes follow the shard's).
    shard_actor: ShardActor | None = None
    semaphores: ClusterSemaphores | None = None
