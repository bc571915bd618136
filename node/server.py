"""Run one node process: bind its port, build the node (node/assembly.py), serve until SIGTERM,
Ctrl-C, a drain or the cluster forgetting it, then stop as the node's `leave` says."""

from __future__ import annotations

import logging
import resource
import signal

import trio
from hypercorn.config import Config as HypercornConfig

from sluicegate.cluster.auth import Credentials

from .assembly import Node
from .config import ConfigError, NodeConfig
from .listener import bind, serve
from .stall_watch import watch_stalls
from .tls import Tls
from .wire import MAX_FRAME

log = logging.getLogger("sluicegate.node")

# Long polls are answered at shutdown, so in-flight requests finish quickly; this bounds the rest.
GRACEFUL_TIMEOUT = 0.5
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
    hypercorn = HypercornConfig()
    hypercorn.bind = [f"[{address}]:{port}" if ":" in address else f"{address}:{port}"]
    hypercorn.graceful_timeout = GRACEFUL_TIMEOUT
    hypercorn.include_server_header = False
    # Frames of node links and of `/ws` are capped at 1 MiB (a bigger one closes with 1009).
    hypercorn.websocket_max_message_size = MAX_FRAME
    hypercorn.accesslog = None
    # Hypercorn's own messages go through our logger, at our level, in our format.
    hypercorn.errorlog = logging.getLogger("sluicegate.hypercorn")
    listeners, binds = bind(hypercorn, tls=tls is not None)
    url = binds[0]
    server_tls = client_tls = None
    if tls is not None:
        server_tls, client_tls = (lambda: tls.server), (lambda: tls.client)
    node = Node(
        config,
        config.cluster.advertise or url.split("//", 1)[1],
        credentials=credentials,
        client_tls=client_tls,
    )
    stopping = trio.Event()

    async def stop_on_signal(task_status: trio.TaskStatus[None]) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            # Said only now, so that whoever waits for this line can already stop us cleanly.
            if not config.semaphores:
                log.warning("No semaphores configured.")
            why = await _stop_asked(signals, node.drain_asked, node.forgotten)
            log.info("%s, shutting down.", why)
            await node.leave()
            stopping.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(stop_on_signal)
        await nursery.start(watch_stalls)
        if tls is not None:
            await nursery.start(reload_tls_on_sighup, tls)
        await nursery.start(node.run)
        async with trio.open_nursery() as http:
            await http.start(
                lambda task_status: serve(
                    node.app,
                    hypercorn,
                    listeners,
                    node.app.websocket_route,
                    shutdown_trigger=stopping.wait,
                    max_connections=connection_limit(config.limits.connections),
                    tls=server_tls,
                    task_status=task_status,
                )
            )
            log.info("Listening on %s", url)
            task_status.started(url)
        # `serve` returns once in-flight requests are done; nothing needs the actors any more.
        node.close()
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
