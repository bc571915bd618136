"""Real nodes in one process: the node's own parts (`node/server.py`'s `join_cluster`, its `/ws`
and `/cluster` routes), over the simulated network, under the virtual clock.

What differs from a node process is only what the seams inject: links are dialled over
`SimNetwork`, randomness comes from the run's seed, a life's generation and the fencing epoch
count virtual time. There is no HTTP (clients speak `/ws`). A crash drops the node's object and
severs its connections; a restart is a new object with empty memory, as a process would be.
"""

from __future__ import annotations

import random
from dataclasses import replace

import trio
from trio_websocket import ConnectionClosed, wrap_client_stream, wrap_server_stream

from sluicegate.cluster.rate_limits import RateLimits
from sluicegate.cluster.semaphores import SemaphoreCore
from sluicegate.node.app import NodeApp
from sluicegate.node.config import NodeConfig
from sluicegate.node.links import HANDSHAKE_TIMEOUT
from sluicegate.node.node_metrics import NodeMetrics
from sluicegate.node.rate_limit_service import RateLimitService
from sluicegate.node.semaphore_actor import SemaphoreActor
from sluicegate.node.semaphore_service import LocalSemaphores
from sluicegate.node.server import join_cluster
from sluicegate.node.wire import MAX_FRAME

from .network import SimNetwork

SECRET = "simulated-cluster"
PORT = 8000


def virtual_epoch() -> int:
    """Fencing epochs in virtual milliseconds: they grow from one owner to the next, as the
    wall clock's do."""
    return int(trio.current_time() * 1000)


class SimNode:
    """One life of a node: from `start` until `crash` (or `stop`)."""

    def __init__(
        self,
        node_id: str,
        config: NodeConfig,
        network: SimNetwork,
        rng: random.Random,
        generation: int,
        join: tuple[str, ...],
    ) -> None:
        self.node_id = node_id
        self.address = f"{node_id}:{PORT}"
        self.config = replace(
            config,
            cluster=replace(config.cluster, node_id=node_id, join=join, secret=SECRET),
        )
        self._network = network
        self._rng = rng
        self.generation = generation
        self._scope: trio.CancelScope | None = None
        self.app: NodeApp | None = None
        self.membership = None
        self.semaphores = None
        self.rate_limits: RateLimitService | None = None
        self.crashed = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until crashed; `task_status.started()` once it listens and has joined."""
        with trio.CancelScope() as self._scope:
            rng = self._rng
            actor = SemaphoreActor(
                SemaphoreCore(self.config.semaphores, epoch=virtual_epoch()), rng=rng
            )
            self.rate_limits = RateLimitService(
                RateLimits(self.config.rate_limits, self.node_id, rng),
                gossip_interval=self.config.cluster.rate_gossip_interval,
                clock=trio.current_time,
            )
            self.app = NodeApp(LocalSemaphores(actor), self.rate_limits, node_id=self.node_id)
            async with trio.open_nursery() as nursery:
                await nursery.start(actor.run)
                await nursery.start(self.rate_limits.run)
                self._network.listen(
                    self.node_id,
                    self.address,
                    lambda stream: nursery.start_soon(self._serve_connection, stream),
                )
                self.membership, self.semaphores, _ = await nursery.start(
                    lambda task_status: join_cluster(
                        self.app,
                        self.rate_limits,
                        NodeMetrics(),
                        self.config,
                        self.address,
                        dialer=self._dial,
                        rng=rng,
                        generation=self.generation,
                        epoch=virtual_epoch,
                        task_status=task_status,
                    )
                )
                task_status.started()

    def crash(self) -> None:
        """Gone at once, memory and all: no goodbye, no hand-over."""
        self.crashed = True
        self._network.crash(self.node_id)
        if self._scope is not None:
            self._scope.cancel()

    async def _dial(self, nursery: trio.Nursery, address: str):
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            stream = await self._network.connect(self.node_id, address)
            return await wrap_client_stream(
                nursery, stream, address, "/cluster", max_message_size=MAX_FRAME
            )

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        """What the node's port does with a connection: a WebSocket handshake, then its route."""
        async with trio.open_nursery() as nursery:
            try:
                request = await wrap_server_stream(nursery, stream, max_message_size=MAX_FRAME)
                route = self.app.websocket_route(request.path) if self.app else None
                if route is None or self.crashed:
                    await request.reject(404)
                    return
                websocket = await request.accept()
                await route(websocket)
            except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                nursery.cancel_scope.cancel()
