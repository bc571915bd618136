"""The node's one port: WebSocket connections go straight to wsproto, the rest to hypercorn.

A connection whose first bytes are a `GET /ws` or `GET /cluster` request is a WebSocket
handshake of a client or of another node: node/websocket.py serves it, no ASGI layer between
the socket and the handler (hypercorn's costs about a seventh of a `/ws` round trip here; see
bench/ws_semaphores.py). Every other connection is hypercorn's: the Throttle HTTP API, metrics,
and any WebSocket handshake that comes later on a kept-alive connection (the ASGI app serves
those too). Deciding needs the first bytes only; they are read, waiting for each as for any
other bytes, and then read again by whichever server takes the connection.

The listener holds at most `max_connections` connections; one past that is answered 503 and
closed at once, so that no number of idle sockets can use up the node's file descriptors.

With TLS (`tls` gives the context for each new connection), every connection first completes
its TLS handshake, within `HANDSHAKE_TIMEOUT`, and everything above then reads the decrypted
stream. One that does not (plain text, a certificate the node refuses) is closed without a word;
one past the limit too.

Hypercorn is driven through `TCPServer`, the class its own `serve` runs per connection, so the
pinned hypercorn version matters (pyproject.toml).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app
from trio_websocket import ConnectionClosed

from .logs import Sparse
from .websocket import WebSocket, accept_handshake
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

# How long a refused connection is given to take its 503, and how often refusals are logged.
REFUSAL_TIMEOUT = 1.0
REFUSAL_LOG_INTERVAL = 10.0

# Given a WebSocket's path, what serves it (None: refuse the handshake with 403).
WebSocketRoute = Callable[[str], Callable[[WebSocket], Awaitable[None]] | None]


def bind(config: HypercornConfig, tls: bool) -> tuple[list[trio.SocketListener], list[str]]:
    """Listen on `config.bind`: the listeners, and their URLs (https:// with `tls`). Bound
    before the node is built, so that a node on port 0 knows its address."""
    listeners, binds = [], []
    scheme = "https" if tls else "http"
    for sock in config.create_sockets().insecure_sockets:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        binds.append(f"{scheme}://{repr_socket_addr(sock.family, sock.getsockname())}")
    return listeners, binds


async def serve(
    app,
    config: HypercornConfig,
    listeners: list[trio.SocketListener],
    websocket_route: WebSocketRoute,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    max_connections: int = 4096,
    tls: Callable[[], ssl.SSLContext] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `listeners` (`bind`) until `shutdown_trigger` returns; then let connections finish
    for at most `config.graceful_timeout`. `websocket_route(path)` serves each WebSocket whose
    connection begins with it; `tls()`, if given, is the TLS context for a new connection."""
    context = WorkerContext(None)
    asgi = wrap_app(app, config.wsgi_max_body_size, None)
    hypercorn = partial(HttpConnection, asgi, config, context, ConnectionState({}))
    connections = Connections(max_connections)
    connection = partial(_serve_connection, connections, hypercorn, websocket_route, tls)
    async with trio.open_nursery() as handlers:
        async with trio.open_nursery() as accepting:
            accepting.start_soon(
                partial(trio.serve_listeners, connection, listeners, handler_nursery=handlers)
            )
            task_status.started()
            await shutdown_trigger()
            accepting.cancel_scope.cancel()
        # Hypercorn closes kept-alive connections after their current request.
        await context.terminated.set()
        handlers.cancel_scope.deadline = trio.current_time() + config.graceful_timeout


class HttpConnection(TCPServer):
    """Hypercorn's connection, closed as soon as its client has closed it and the request in
    hand (if any) is done: hypercorn's own keeps the socket until its keep-alive timeout, so
    clients that connect and go away fast could hold every connection the listener allows."""

    async def _read_data(self) -> None:
        await super()._read_data()
        # The keep-alive timer is all that would keep the connection's task group open.
        await self.idle_task.stop()


class Connections:
    """How many connections are open, against the most the listener holds."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self._refusals = Sparse(REFUSAL_LOG_INTERVAL)

    @property
    def refused(self) -> int:
        return self._refusals.count

    def refusal(self, now: float) -> bytes:
        """The 503 for a connection past the limit (and a log line, at most every 10 s)."""
        since = self._refusals.due(now)
        if since is not None:
            log.warning(
                "%d connections open, the most this node holds ([limits] connections): "
                "refused %d since the last such line.",
                self.open,
                since,
            )
        body = (
            f"Too many connections: this node holds at most {self.limit} at once "
            "([limits] connections); retry."
        ).encode()
        return (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )


async def _serve_connection(
    connections: Connections,
    hypercorn: Callable[[trio.abc.HalfCloseableStream], HttpConnection],
    websocket_route: WebSocketRoute,
    tls: Callable[[], ssl.SSLContext] | None,
    socket_stream: trio.SocketStream,
) -> None:
    if connections.open >= connections.limit:
        refusal = connections.refusal(trio.current_time())
        if tls is None:  # (a TLS client could not read it)
            with trio.move_on_after(REFUSAL_TIMEOUT):
                try:
                    await socket_stream.send_all(refusal)
                except trio.BrokenResourceError:
                    pass
        await trio.aclose_forcefully(socket_stream)
        return
    stream = Accepted(socket_stream, connections)
    try:
        if tls is not None:
            secure = trio.SSLStream(socket_stream, tls(), server_side=True, https_compatible=True)
            stream.stream = secure
            secured = False
            with trio.move_on_after(HANDSHAKE_TIMEOUT):
                try:
                    await secure.do_handshake()
                    secured = True
                except trio.BrokenResourceError:
                    pass  # plain text, or a certificate refused: nothing to answer in
            if not secured:
                return
        await _route(hypercorn, websocket_route, stream)
    finally:
        await trio.aclose_forcefully(stream)


async def _route(
    hypercorn: Callable[[trio.abc.HalfCloseableStream], HttpConnection],
    websocket_route: WebSocketRoute,
    stream: Accepted,
) -> None:
    try:
        path = await stream.read_request_start()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return
    if path is None:
        await hypercorn(stream).run()
        return
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            accepted = await accept_handshake(
                stream, lambda target: websocket_route(target.partition("?")[0]), MAX_FRAME
            )
        if accepted is None:
            return  # refused: no such route
        route, websocket = accepted
        try:
            await route(websocket)
        finally:
            with trio.move_on_after(CLOSE_TIMEOUT):
                await websocket.aclose()
    except* (ConnectionClosed, trio.TooSlowError, trio.BrokenResourceError, OSError):
        pass  # the other side went away, or never finished its handshake
    except* Exception:
        # A bug: it ends this connection, never the node.
        log.exception("A WebSocket to %s failed.", path)
    finally:
        await trio.aclose_forcefully(stream)


class Accepted(trio.abc.HalfCloseableStream):
    """An accepted connection: counted among the open ones until its socket is closed (hypercorn
    closes it before its own task ends), and read again from its start by whichever server
    takes it after `read_request_start`."""

    def __init__(self, stream: trio.SocketStream, connections: Connections) -> None:
        self.stream: trio.SocketStream | trio.SSLStream = stream  # (the TLS one, once it is on)
        # Hypercorn asks a connection's socket for the addresses of both ends.
        self.socket = stream.socket
        self._first = b""
        self._connections: Connections | None = connections
        connections.open += 1

    async def read_request_start(self) -> str | None:
        """`/ws` or `/cluster` if the connection begins with a request for it, else None.

        Reads only as far as it takes to tell. A connection silent for `FIRST_BYTES_TIMEOUT`
        is hypercorn's, whose own timeouts end it."""
        with trio.move_on_after(FIRST_BYTES_TIMEOUT):
            while len(self._first) < _LONGEST:
                data = await self.stream.receive_some(_LONGEST - len(self._first))
                if not data:
                    return None
                self._first += data
                for prefix, path in WEBSOCKET_REQUESTS:
                    if self._first.startswith(prefix):
                        return path
                if not any(prefix.startswith(self._first) for prefix, _ in WEBSOCKET_REQUESTS):
                    return None
        return None

    @property
    def plain_socket(self) -> trio.socket.SocketType | None:
        """The socket, if the connection is plain TCP (not TLS) with nothing read ahead."""
        if self._first or not isinstance(self.stream, trio.SocketStream):
            return None
        return self.stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if not self._first:
            return await self.stream.receive_some(max_bytes)
        await trio.lowlevel.checkpoint()
        size = len(self._first) if max_bytes is None else max_bytes
        data, self._first = self._first[:size], self._first[size:]
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        if self._connections is not None:
            self._connections.open -= 1
            self._connections = None
        await self.stream.aclose()
