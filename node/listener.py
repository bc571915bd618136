"""The node's one port: WebSocket connections go straight to trio-websocket, the rest to hypercorn.

A connection whose first bytes are a `GET /ws` or `GET /cluster` request is a WebSocket
handshake of a client or of another node: trio-websocket serves it, with no ASGI layer between
the socket and the handler (hypercorn's costs about a seventh of a `/ws` round trip here; see
bench/ws_semaphores.py). Every other connection is hypercorn's: the Throttle HTTP API, metrics,
and any WebSocket handshake that comes later on a kept-alive connection (the ASGI app serves
those too). Deciding needs the first bytes only, which are peeked at, not read, so whichever
server takes the connection reads it from its start.

Hypercorn is driven through `TCPServer`, the class its own `serve` runs per connection, so the
pinned hypercorn version matters (pyproject.toml).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_server_stream

from .wire import MAX_FRAME

log = logging.getLogger("sluicegate.node")

# The request lines that begin a WebSocket this module serves: (prefix, path).
WEBSOCKET_REQUESTS = tuple(
    (f"GET {path}{end}".encode(), path) for path in ("/ws", "/cluster") for end in (" ", "?")
)
_LONGEST = max(len(prefix) for prefix, _ in WEBSOCKET_REQUESTS)
# How long a new connection may take to send its first bytes, and then its handshake.
FIRST_BYTES_TIMEOUT = 10.0
HANDSHAKE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 1.0
# trio-websocket reads 4 KiB at a time by default; frames of up to 1 MiB want bigger reads.
RECEIVE_BYTES = 65536

# Given a WebSocket's path, what serves it (None: refuse the handshake with 403).
WebSocketRoute = Callable[[str], Callable[[WebSocketConnection], Awaitable[None]] | None]


async def serve(
    app,
    config: HypercornConfig,
    websocket_route: WebSocketRoute,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `config.bind` until `shutdown_trigger` returns; then let connections finish for at
    most `config.graceful_timeout`. `websocket_route(path)` serves each WebSocket whose
    connection begins with it; `task_status.started` gets the bound URLs."""
    sockets = config.create_sockets()
    listeners, binds = [], []
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
    context = WorkerContext(None)
    asgi = wrap_app(app, config.wsgi_max_body_size, None)
    hypercorn = partial(TCPServer, asgi, config, context, ConnectionState({}))
    connection = partial(_serve_connection, hypercorn, websocket_route)
    async with trio.open_nursery() as handlers:
        async with trio.open_nursery() as accepting:
            accepting.start_soon(
                partial(trio.serve_listeners, connection, listeners, handler_nursery=handlers)
            )
            task_status.started(binds)
            await shutdown_trigger()
            accepting.cancel_scope.cancel()
        # Hypercorn closes kept-alive connections after their current request.
        await context.terminated.set()
        handlers.cancel_scope.deadline = trio.current_time() + config.graceful_timeout


async def _serve_connection(
    hypercorn: Callable[[trio.SocketStream], TCPServer],
    websocket_route: WebSocketRoute,
    stream: trio.SocketStream,
) -> None:
    path = await _websocket_path(stream)
    if path is None:
        await hypercorn(stream).run()
        return
    try:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                request = await wrap_server_stream(
                    nursery, stream, max_message_size=MAX_FRAME, receive_buffer_size=RECEIVE_BYTES
                )
                route = websocket_route(request.path.partition("?")[0])
                if route is None:
                    await request.reject(403)
                    return
                websocket = await request.accept()
            try:
                await route(websocket)
            finally:
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await websocket.aclose()
            nursery.cancel_scope.cancel()
    except* (ConnectionClosed, trio.TooSlowError, trio.BrokenResourceError, OSError):
        pass  # the other side went away, or never finished its handshake
    except* Exception:
        # A bug: it ends this connection, never the node.
        log.exception("A WebSocket to %s failed.", path)
    finally:
        await trio.aclose_forcefully(stream)


async def _websocket_path(stream: trio.SocketStream) -> str | None:
    """`/ws` or `/cluster` if the connection begins with a request for it, else None."""
    with trio.move_on_after(FIRST_BYTES_TIMEOUT):
        while True:
            try:
                first = await stream.socket.recv(_LONGEST, socket.MSG_PEEK)
            except OSError:
                return None
            for prefix, path in WEBSOCKET_REQUESTS:
                if first.startswith(prefix):
                    return path
            if not first or not any(prefix.startswith(first) for prefix, _ in WEBSOCKET_REQUESTS):
                return None
            # A request line split over packets: rare, so a short nap beats anything smarter
            # (peeking again at once would spin).
            await trio.sleep(0.001)
    return None
