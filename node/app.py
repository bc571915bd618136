"""The node's one ASGI application (served by hypercorn on the node's one port, node/listener.py).

HTTP requests go to the Throttle API. WebSocket connections to `/ws` speak our own protocol
(docs/protocol.md); those to `/cluster` are node links, served only when the node is part of a
cluster; every other WebSocket is refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sluicegate.cluster.auth import Credentials
from sluicegate.cluster.limits import DEFAULT_LIMITS, Limits

from .asgi_websocket import AsgiWebSocket
from .cluster_admin import ClusterAdmin
from .cluster_status import MemberStatuses
from .http_shell import Request, Response, Router, ThrottleApi, handle
from .latencies import Latencies
from .links import Links, MessageConnection
from .rate_limit_service import RateLimitService
from .semaphore_service import Semaphores
from .ws_shell import FrameTurns, WsConnection


class NodeApp:
    def __init__(
        self,
        semaphores: Semaphores,
        rate_limits: RateLimitService,
        node_id: str = "node",
        extra_metrics: Callable[[], str] = lambda: "",
        limits: Limits = DEFAULT_LIMITS,
        credentials: Credentials | None = None,
        links: Links | None = None,
        member_statuses: MemberStatuses | None = None,
        cluster_admin: ClusterAdmin | None = None,
    ) -> None:
        """`credentials`: the tokens of a node with `[auth]` (None: anyone may do anything);
        `links`: a cluster node's, served at `/cluster`; `member_statuses` and `cluster_admin`
        as for `ThrottleApi`."""
        self.throttle = ThrottleApi(
            semaphores, rate_limits, extra_metrics, member_statuses, cluster_admin
        )
        self.latencies = Latencies()
        self.router = Router(self.throttle, self.latencies)
        self.router.credentials = self._credentials = credentials
        self.links = links
        # How this node names itself to `/ws` clients (its id in a cluster).
        self.node_id = node_id
        self._limits = limits
        self._turns = FrameTurns()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            request = Request(scope, receive, self._limits.request_size)
            response = await handle(self.router, request)
            if response is not None:
                await _send(send, response, head=request.method == "HEAD")
        elif scope["type"] == "websocket":
            # Reached only by a handshake on a kept-alive HTTP connection: the rest go straight
            # to `websocket_route` (node/listener.py).
            route = self.websocket_route(scope["path"])
            if route is None:
                await send({"type": "websocket.close", "code": 1008})
                return
            websocket = AsgiWebSocket(receive, send)
            if await websocket.accept():
                await route(websocket)
                await websocket.aclose()

    def websocket_route(self, path: str) -> Callable[[MessageConnection], Awaitable[None]] | None:
        """What serves a WebSocket to `path`: `/ws` clients, and `/cluster` node links in a
        cluster; None for anything else."""
        if path == "/ws":
            return self._serve_client
        if path == "/cluster" and self.links is not None:
            return self.links.accept
        return None

    async def _serve_client(self, websocket: MessageConnection) -> None:
        throttle = self.throttle
        await WsConnection(
            websocket,
            throttle.semaphores,
            throttle.rate_limits,
            self.node_id,
            self.latencies,
            peers_per_connection=self._limits.peers_per_connection,
            turns=self._turns,
            credentials=self._credentials,
        ).run()


async def _send(send, response: Response, head: bool) -> None:
    headers = list(response.headers)
    if response.content_type is not None:
        headers.append((b"content-type", response.content_type.encode()))
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else response.body})
