"""Run one node: the semaphore actor and the HTTP server, until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import signal

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from sluicegate.cluster.semaphores import SemaphoreCore

from .app import NodeApp
from .config import NodeConfig
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
    actor = SemaphoreActor(SemaphoreCore(config.semaphores))
    hypercorn = HypercornConfig()
    hypercorn.bind = [f"[{address}]:{port}" if ":" in address else f"{address}:{port}"]
    hypercorn.graceful_timeout = GRACEFUL_TIMEOUT
    hypercorn.include_server_header = False
    hypercorn.accesslog = None
    # Hypercorn's own messages go through our logger, at our level, in our format.
    hypercorn.errorlog = logging.getLogger("sluicegate.hypercorn")
    stopping = trio.Event()

    async def stop_on_signal(task_status: trio.TaskStatus[None]) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            # Said only now, so that whoever waits for this line can already stop us cleanly.
            if not config.semaphores:
                log.warning("No semaphores configured.")
            async for signum in signals:
                log.info("Received %s, shutting down.", signal.Signals(signum).name)
                await actor.stop_blocking()
                stopping.set()
                return

    async with trio.open_nursery() as nursery:
        await nursery.start(stop_on_signal)
        await nursery.start(actor.run)
        async with trio.open_nursery() as http:
            binds = await http.start(
                lambda task_status: serve(
                    NodeApp(actor),
                    hypercorn,
                    shutdown_trigger=stopping.wait,
                    task_status=task_status,
                )
            )
            log.info("Listening on %s", binds[0])
            task_status.started(binds[0])
        # `serve` returns once in-flight requests are done; nothing needs the actor any more.
        actor.close()
    log.info("Stopped.")
