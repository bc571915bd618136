"""Run one node: the semaphore actor and the HTTP server (and, in a cluster, membership and
node links), until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import random
import signal
import time

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from sluicegate.cluster.membership import Gossip, Membership
from sluicegate.cluster.semaphores import SemaphoreCore

from .app import NodeApp
from .config import ClusterConfig, NodeConfig
from .link_codec import LINK_CODEC
from .links import Links, websocket_dialer
from .membership_actor import MembershipActor
from .node_metrics import ClusterCollector, NodeMetrics
from .semaphore_actor import SemaphoreActor

log = logging.getLogger("sluicegate.node")

# Long polls are answered at shutdown, so in-flight requests finish quickly; this bounds the rest.
GRACEFUL_TIMEOUT = 0.5


async def run_node(
    config: NodeConfig,
    address: str,
    port: int,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGTERM or SIGINT; `task_status.started` receives the bound URL."""
    # Fencing tokens continue above this node's previous life: its start time orders its lives.
    actor = SemaphoreActor(SemaphoreCore(config.semaphores, epoch=time.time_ns() // 1_000_000))
    hypercorn = HypercornConfig()
    hypercorn.bind = [f"[{address}]:{port}" if ":" in address else f"{address}:{port}"]
    hypercorn.graceful_timeout = GRACEFUL_TIMEOUT
    hypercorn.include_server_header = False
    hypercorn.accesslog = None
    # Hypercorn's own messages go through our logger, at our level, in our format.
    hypercorn.errorlog = logging.getLogger("sluicegate.hypercorn")
    stopping = trio.Event()

    cluster: MembershipActor | None = None

    async def stop_on_signal(task_status: trio.TaskStatus[None]) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            # Said only now, so that whoever waits for this line can already stop us cleanly.
            if not config.semaphores:
                log.warning("No semaphores configured.")
            async for signum in signals:
                log.info("Received %s, shutting down.", signal.Signals(signum).name)
                await actor.stop_blocking()
                if cluster is not None:
                    await cluster.leave()
                stopping.set()
                return

    app = NodeApp(actor)
    async with trio.open_nursery() as nursery:
        await nursery.start(stop_on_signal)
        await nursery.start(actor.run)
        async with trio.open_nursery() as http:
            binds = await http.start(
                lambda task_status: serve(
                    app, hypercorn, shutdown_trigger=stopping.wait, task_status=task_status
                )
            )
            url = binds[0]
            if config.cluster.secret:
                address = config.cluster.advertise or url.split("//", 1)[1]
                cluster = await nursery.start(
                    join_cluster, app, config.cluster, address, list(config.semaphores)
                )
            log.info("Listening on %s", url)
            task_status.started(url)
        # `serve` returns once in-flight requests are done; nothing needs the actors any more.
        actor.close()
        nursery.cancel_scope.cancel()
    log.info("Stopped.")


async def join_cluster(
    app: NodeApp,
    config: ClusterConfig,
    address: str,
    semaphores: list[str],
    *,
    task_status: trio.TaskStatus[MembershipActor],
) -> None:
    """Run membership and node links for this node, reachable at `address` (host:port)."""
    assert config.secret, "the command line refuses a cluster without a secret"
    node_id = config.node_id or address
    rng = random.Random()
    membership_actor: MembershipActor | None = None

    async def deliver(remote_id: str, messages: list[object]) -> None:
        for message in messages:
            if isinstance(message, Gossip):
                membership_actor.receive(message)
            else:
                log.warning("Unexpected %s from %s.", type(message).__name__, remote_id)

    links = Links(node_id, config.secret.encode(), LINK_CODEC, websocket_dialer, deliver, rng)
    # A new generation per start: the wall clock only orders this node's own lives.
    membership = Membership(
        node_id, address, time.time_ns(), config.join, down_after=config.down_after
    )
    membership_actor = MembershipActor(membership, links, interval=config.gossip_interval, rng=rng)
    metrics = NodeMetrics()
    metrics.registry.register(ClusterCollector(membership_actor, links, semaphores))
    app.join_cluster(links, metrics.render)
    log.info("Node %s joining the cluster through %s.", node_id, ", ".join(config.join) or "-")
    async with trio.open_nursery() as nursery:
        await nursery.start(membership_actor.run)
        task_status.started(membership_actor)
