"""Run one node: the semaphore actor and the HTTP server (and, in a cluster, membership and
node links), until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import random
import resource
import signal
import time
from collections.abc import Callable
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig

from sluicegate.cluster.auth import Credentials
from sluicegate.cluster.dns_seeds import DnsSeeds, is_dns_entry, parse_dns_entry
from sluicegate.cluster.membership import Gossip, Membership
from sluicegate.cluster.ownership import Ownership
from sluicegate.cluster.rate_limits import RateEvents, RateHandover, RateLimits, RateOperation
from sluicegate.cluster.semaphores import SemaphoreCore
from sluicegate.cluster.shard import Shard
from sluicegate.cluster.slots import takeover_bound

from .app import NodeApp
from .clock import TRIO_CLOCK, Clock
from .cluster_admin import ClusterAdmin
from .cluster_status import MemberStatuses, members_status
from .config import ConfigError, NodeConfig, definitions_digest
from .dns_discovery import DnsDiscovery, dns_resolver
from .gc_pauses import GC_PAUSES
from .latencies import LatencyCollector
from .link_codec import LINK_CODEC
from .links import Dialer, Links, websocket_dialer
from .listener import serve
from .membership_actor import MembershipActor
from .node_metrics import ClusterCollector, NodeMetrics, RateLimitCollector
from .rate_limit_service import RateLimitService
from .rpc import Call, Failure, Reply, Rpc
from .semaphore_actor import SemaphoreActor
from .semaphore_service import ClusterSemaphores, LocalSemaphores, epoch_now
from .shard_actor import ShardActor
from .stall_watch import watch_stalls
from .tls import Tls
from .wire import MAX_FRAME

log = logging.getLogger("sluicegate.node")

# Long polls are answered at shutdown, so in-flight requests finish quickly; this bounds the rest.
GRACEFUL_TIMEOUT = 0.5
# A stopping node hands its slots on for at most this long before it says goodbye.
HAND_ON_TIMEOUT = 1.0
# File descriptors kept for what is not a client's connection: node links, logs, the listener.
FILES_KEPT = 256


def connection_limit(wanted: int) -> int:
    """Raise this process's soft limit of open files to its hard limit, and return how many
    connections the listener may hold: `wanted`, or fewer if the files would run out first
    (then accept() would fail for everyone, and no refusal could be sent)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or wanted <= soft - FILES_KEPT:
        return wanted
    usable = max(soft - FILES_KEPT, soft // 2)
    log.warning(
        "[limits] connections is %d, but this process may open only %d files: holding at most "
        "%d connections (raise `ulimit -n`).",
        wanted,
        soft,
        usable,
    )
    return usable


async def run_node(
    config: NodeConfig,
    address: str,
    port: int,
    *,
    tls: Tls | None = None,
    credentials: Credentials | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGTERM or SIGINT, over TLS if `tls` is given (its files read again on
    SIGHUP), to clients with tokens if `credentials` are; `task_status.started` receives the
    bound URL."""
    # Fencing tokens continue above this node's previous life: its start time orders its lives.
    limits = config.limits
    actor = SemaphoreActor(
        SemaphoreCore(config.semaphores, epoch=epoch_now(), limits=limits),
        limits=limits,
    )
    hypercorn = HypercornConfig()
    hypercorn.bind = [f"[{address}]:{port}" if ":" in address else f"{address}:{port}"]
    hypercorn.graceful_timeout = GRACEFUL_TIMEOUT
    hypercorn.include_server_header = False
    # Frames of node links and of `/ws` are capped at 1 MiB (a bigger one closes with 1009).
    hypercorn.websocket_max_message_size = MAX_FRAME
    hypercorn.accesslog = None
    # Hypercorn's own messages go through our logger, at our level, in our format.
    hypercorn.errorlog = logging.getLogger("sluicegate.hypercorn")
    stopping = trio.Event()

    cluster: tuple[MembershipActor, ClusterSemaphores] | None = None
    # Set by `POST /drain` (node/cluster_admin.py), or once the others forgot this life: stop
    # as on SIGTERM.
    drain_asked, forgotten = trio.Event(), trio.Event()

    async def stop_on_signal(task_status: trio.TaskStatus[None]) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            # Said only now, so that whoever waits for this line can already stop us cleanly.
            if not config.semaphores:
                log.warning("No semaphores configured.")
            log.info("%s, shutting down.", await _stop_asked(signals, drain_asked, forgotten))
            await actor.stop_blocking()
            if cluster is not None:
                membership, semaphores = cluster
                await semaphores.leave(timeout=HAND_ON_TIMEOUT)
                await rate_limits.leave(timeout=0.3)
                await membership.leave()
            stopping.set()

    rate_limits = RateLimitService(
        RateLimits(config.rate_limits, limits=limits),
        gossip_interval=config.cluster.rate_gossip_interval,
    )
    metrics = NodeMetrics()
    if config.rate_limits:  # none configured: /metrics stays exactly Throttle's
        metrics.registry.register(RateLimitCollector(rate_limits))
    app = NodeApp(
        LocalSemaphores(actor, limits),
        rate_limits,
        extra_metrics=metrics.render,
        limits=limits,
        credentials=credentials,
    )
    server_tls = client_tls = None
    if tls is not None:
        server_tls, client_tls = (lambda: tls.server), (lambda: tls.client)
        app.throttle.member_statuses = MemberStatuses(partial(members_status, tls=client_tls))
    if config.rate_limits or config.cluster.secret:
        metrics.registry.register(LatencyCollector(app.latencies))
        metrics.registry.register(GC_PAUSES)
    async with trio.open_nursery() as nursery:
        await nursery.start(stop_on_signal)
        await nursery.start(watch_stalls)
        await nursery.start(actor.run)
        await nursery.start(rate_limits.run)
        if tls is not None:
            await nursery.start(reload_tls_on_sighup, tls)
        async with trio.open_nursery() as http:
            binds = await http.start(
                lambda task_status: serve(
                    app,
                    hypercorn,
                    app.websocket_route,
                    shutdown_trigger=stopping.wait,
                    max_connections=connection_limit(limits.connections),
                    tls=server_tls,
                    task_status=task_status,
                )
            )
            url = binds[0]
            app.node_id = url.split("//", 1)[1]
            if config.cluster.secret:
                address = config.cluster.advertise or url.split("//", 1)[1]
                cluster = await nursery.start(
                    partial(
                        join_cluster,
                        dialer=partial(websocket_dialer, tls=client_tls),
                        drain_asked=drain_asked,
                        forgotten=forgotten,
                    ),
                    app,
                    rate_limits,
                    metrics,
                    config,
                    address,
                )
            log.info("Listening on %s", url)
            task_status.started(url)
        # `serve` returns once in-flight requests are done; nothing needs the actors any more.
        actor.close()
        nursery.cancel_scope.cancel()
    log.info("Stopped.")


async def reload_tls_on_sighup(tls: Tls, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Read the certificate, key and CAs again on each SIGHUP (a renewed certificate): new
    connections get them, open ones keep theirs. Files that do not load leave the old ones."""
    with trio.open_signal_receiver(signal.SIGHUP) as hangups:
        task_status.started()
        async for _ in hangups:
            try:
                tls.reload()
            except ConfigError as error:
                log.error("SIGHUP: kept the TLS files loaded before, as %s", error)
            else:
                log.info("SIGHUP: read the TLS certificate, key and CAs again.")


async def _stop_asked(signals, drain_asked: trio.Event, forgotten: trio.Event) -> str:
    """Wait for SIGTERM or SIGINT, a drain asked over HTTP, or the others forgetting this life;
    which it was."""
    reason = ""
    async with trio.open_nursery() as nursery:

        async def on_signal() -> None:
            nonlocal reason
            async for signum in signals:
                reason = f"Received {signal.Signals(signum).name}"
                nursery.cancel_scope.cancel()

        async def on_event(event: trio.Event, why: str) -> None:
            nonlocal reason
            await event.wait()
            reason = why
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_signal)
        nursery.start_soon(on_event, drain_asked, "Asked to drain (POST /drain)")
        nursery.start_soon(on_event, forgotten, "Forgotten by the cluster (sluicegate forget)")
    return reason


async def join_cluster(
    app: NodeApp,
    rate_limits: RateLimitService,
    metrics: NodeMetrics,
    config: NodeConfig,
    address: str,
    *,
    dialer: Dialer = websocket_dialer,
    rng: random.Random | None = None,
    generation: int | None = None,
    epoch: Callable[[], int] = epoch_now,
    clock: Clock = TRIO_CLOCK,
    drain_asked: trio.Event | None = None,
    forgotten: trio.Event | None = None,
    task_status: trio.TaskStatus[tuple[MembershipActor, ClusterSemaphores]],
) -> None:
    """Run membership, node links, ownership of slots and forwarding for this node, reachable
    at `address`.

    The seams, for the simulations (`simulations/`), which run nodes over memory streams under a
    virtual clock: how links are dialled, the random source, this life's generation (default:
    the wall clock, which orders a node's lives), the clock of the cluster's eras and fencing
    epochs, and the node's own clock."""
    cluster = config.cluster
    assert cluster.secret, "the command line refuses a cluster without a secret"
    node_id = cluster.node_id or address
    # Peer ids and handshake nonces must not be guessable from the ones seen: the system's source.
    rng = rng or random.SystemRandom()
    # A new generation per start: the wall clock only orders this node's own lives.
    generation = time.time_ns() if generation is None else generation
    membership_actor: MembershipActor | None = None
    shard_actor: ShardActor | None = None
    semaphores: ClusterSemaphores | None = None
    rpc: Rpc | None = None

    async def deliver(remote_id: str, messages: list[object]) -> None:
        # Links deliver only once started, after every part below is built.
        assert membership_actor is not None and shard_actor is not None and rpc is not None
        for message in messages:
            if isinstance(message, Gossip):
                membership_actor.receive(message)
            elif isinstance(message, Call):
                serve = rate_limits.serve if isinstance(message.op, RateOperation) else None
                nursery.start_soon(rpc.serve, remote_id, message, serve or shard_actor.call)
            elif isinstance(message, RateEvents):
                rate_limits.receive(message)
            elif isinstance(message, RateHandover):
                rate_limits.handed_over(message)
            elif isinstance(message, Reply | Failure):
                rpc.answered(message)
            else:
                shard_actor.deliver(remote_id, message)

    links = Links(
        node_id,
        cluster.secret.encode(),
        LINK_CODEC,
        dialer,
        deliver,
        rng,
        generation,
        on_link_down=lambda remote_id: rpc.link_down(remote_id) if rpc is not None else None,
        clock=clock,
    )
    membership = Membership(
        node_id,
        address,
        generation,
        [entry for entry in cluster.join if not is_dns_entry(entry)],
        down_after=cluster.down_after,
        definitions=definitions_digest(config),
    )
    rpc = Rpc(links, clock=clock, heard_of=membership.last_advanced)
    membership_actor = MembershipActor(
        membership,
        links,
        interval=cluster.gossip_interval,
        rng=rng,
        clock=clock,
        # Calls forwarded to a member counted down fail at once: its slots move on.
        on_member_down=rpc.link_down,
        on_change=lambda: semaphores.follow_members() if semaphores is not None else None,
        on_forgotten=forgotten.set if forgotten is not None else lambda: None,
    )
    ownership = Ownership(
        node_id,
        lease=cluster.lease or cluster.down_after,
        settle=cluster.down_after,
        era_floor=epoch(),
        rng=rng,
        now=clock.now(),
    )
    shard = Shard(
        node_id,
        config.semaphores,
        ownership,
        rng,
        cold_start_grace=cluster.cold_start_grace,
        limits=config.limits,
    )
    shard_actor = ShardActor(
        shard,
        send=links.send,
        on_slot_changes=rate_limits.slots_changed,
        clock=clock,
    )
    semaphores = ClusterSemaphores(
        shard_actor,
        membership_actor,
        rpc,
        takeover=takeover_bound(cluster.down_after, ownership.lease),
        limits=config.limits,
        clock=clock,
    )
    dns_names = [parse_dns_entry(entry) for entry in cluster.join if is_dns_entry(entry)]
    discovery = DnsDiscovery(
        DnsSeeds(dns_names, address),
        dns_resolver(cluster.resolver),
        membership_actor.use_found_seeds,
        clock=clock,
    )
    metrics.registry.register(ClusterCollector(membership_actor, links, semaphores))
    rate_limits.core.origin = node_id
    rate_limits.join_cluster(ownership, membership_actor, rpc, links)
    app.join_cluster(semaphores, links)
    if drain_asked is not None:
        app.throttle.cluster_admin = ClusterAdmin(
            node_id, cluster.secret.encode(), membership_actor, drain_asked
        )
    log.info("Node %s joining the cluster through %s.", node_id, ", ".join(cluster.join) or "-")
    async with trio.open_nursery() as nursery:
        await nursery.start(shard_actor.run)
        await nursery.start(membership_actor.run)
        if dns_names:
            await nursery.start(discovery.run)
        await nursery.start(semaphores.run)
        task_status.started((membership_actor, semaphores))
