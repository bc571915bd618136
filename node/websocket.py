"""A WebSocket over a trio stream, driven by wsproto in the tasks that use it.

trio-websocket runs a reader task per connection that hands each message to the reader through
a memory channel: two task switches and a channel per message received, and a lock per message
sent. A node link and a `/ws` connection have one task that receives and one that sends, so
here the receiving task reads the socket and parses frames itself, and a message sent is one
`send_all`. Control frames are answered where they are read: a ping gets its pong, a close its
close. The interface is trio-websocket's (`send_message`, `get_message`, `aclose`,
`ConnectionClosed` with its `CloseReason`), so the links and the `/ws` shell are written
against one kind of connection, whichever serves it (`node/asgi_websocket.py` is the other).

`dial` opens one to another node; `accept_handshake` takes one that a client opened.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import trio
from trio_websocket import CloseReason, ConnectionClosed, ConnectionRejected, HandshakeError
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

# Bytes read from the socket at a time: frames of up to a MiB want big reads.
RECEIVE_BYTES = 65536
# Close codes (RFC 6455): no close frame came, and a message over the size allowed.
ABNORMAL = 1006
TOO_BIG = 1009

H = TypeVar("H")


class WebSocket:
    """An open WebSocket; `max_message` bounds a message received, in bytes."""

    def __init__(self, stream: trio.abc.Stream, ws: WSConnection, max_message: int) -> None:
        self._stream = stream
        self._ws = ws
        self._max_message = max_message
        self._send_lock = trio.Lock()
        self._messages: deque[bytes | str] = deque()
        # The message being received, in parts, and its size so far.
        self._parts: list[Any] = []
        self._size = 0
        self.closed: CloseReason | None = None

    async def send_message(self, message: bytes | str) -> None:
        if self.closed is not None:
            raise ConnectionClosed(self.closed)
        event = BytesMessage(message) if isinstance(message, bytes) else TextMessage(message)
        try:
            await self._send(event)
        except LocalProtocolError:  # closed while this waited for its turn to send
            raise ConnectionClosed(self.closed or CloseReason(ABNORMAL, None)) from None

    async def get_message(self) -> bytes | str:
        """The next message; `ConnectionClosed` once none is left and the connection closed."""
        while not self._messages:
            if self.closed is not None:
                raise ConnectionClosed(self.closed)
            try:
                data = await _receive(self._stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                self._lost()
                continue
            self._ws.receive_data(data)
            await self._take(self._ws.events())
        return self._messages.popleft()

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        """Send a close frame (unless the connection closed already) and close the stream."""
        try:
            if self.closed is None:
                self.closed = CloseReason(code, reason)
                await self._send(CloseConnection(code, reason or ""))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await self._stream.aclose()

    async def _take(self, events: Iterable[Event]) -> None:
        """Messages to `_messages`; pings and closes answered (a coroutine per read, not per
        message: data needs no waiting)."""
        for event in events:
            if self.closed is not None:
                return
            if isinstance(event, BytesMessage | TextMessage):
                if not self._add(event):
                    await self.aclose(TOO_BIG, f"a message over {self._max_message} bytes")
            elif isinstance(event, Ping):
                await self._send_control(event.response())
            elif isinstance(event, CloseConnection):
                self.closed = CloseReason(event.code, event.reason or None)
                await self._send_control(event.response())
                await self._stream.aclose()

    def _add(self, part: BytesMessage | TextMessage) -> bool:
        """Add a part of a message; False if the message grew past `max_message`."""
        self._size += len(part.data)
        if self._size > self._max_message:
            return False
        self._parts.append(part.data)
        if part.message_finished:
            parts, self._parts, self._size = self._parts, [], 0
            joiner = b"" if isinstance(part, BytesMessage) else ""
            self._messages.append(parts[0] if len(parts) == 1 else joiner.join(parts))
        return True

    async def _send(self, event: Event) -> None:
        async with self._send_lock:
            await self._stream.send_all(self._ws.send(event))

    async def _send_control(self, event: Event) -> None:
        """A pong or a close answered: the other end may have gone already."""
        try:
            await self._send(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._lost()

    def _lost(self) -> None:
        if self.closed is None:
            self.closed = CloseReason(ABNORMAL, "the connection was lost")


async def _receive(stream: trio.abc.Stream) -> bytes:
    data = await stream.receive_some(RECEIVE_BYTES)
    return data if isinstance(data, bytes) else bytes(data)


async def _handshake_events(stream: trio.abc.Stream, ws: WSConnection) -> list[Event]:
    """What the next bytes of an opening handshake make of it; wsproto's `RemoteProtocolError`
    if they are no handshake."""
    data = await _receive(stream)
    if not data:
        raise trio.BrokenResourceError("closed during the WebSocket handshake")
    ws.receive_data(data)
    return list(ws.events())


async def dial(
    address: str, path: str, context: ssl.SSLContext | None, max_message: int
) -> WebSocket:
    """Open a WebSocket to `path` at `address` ("host:port"), over TLS with `context` if
    given. Raises `ConnectionRejected` if the server answers other than 101, `HandshakeError`
    if it answers no HTTP at all, and OSError and trio's stream errors as the socket does."""
    parts = urlsplit(f"//{address}")
    host, port = parts.hostname, parts.port
    if host is None or port is None:
        raise OSError(f"not host:port: {address!r}")
    stream: trio.abc.Stream
    if context is None:
        stream = await trio.open_tcp_stream(host, port)
    else:
        stream = await trio.open_ssl_over_tcp_stream(
            host, port, ssl_context=context, https_compatible=True
        )
    try:
        ws = WSConnection(ConnectionType.CLIENT)
        await stream.send_all(ws.send(Request(host=address, target=path)))
        while True:
            try:
                events = await _handshake_events(stream, ws)
            except RemoteProtocolError as error:
                raise HandshakeError(f"{address} answered no WebSocket: {error}") from None
            for index, event in enumerate(events):
                if isinstance(event, AcceptConnection):
                    websocket = WebSocket(stream, ws, max_message)
                    await websocket._take(events[index + 1 :])
                    return websocket
                if isinstance(event, RejectConnection):
                    raise ConnectionRejected(event.status_code, tuple(event.headers), None)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


async def accept_handshake(
    stream: trio.abc.Stream, route: Callable[[str], H | None], max_message: int
) -> tuple[H, WebSocket] | None:
    """Read a client's opening handshake from `stream`, and accept it if `route` gives
    something for its target (path and query): that, and the WebSocket. Else it is answered 403,
    and None returned. Raises `trio.BrokenResourceError` if the client goes before it asked, or
    asks for something else than a WebSocket (answered 400 where wsproto says why)."""
    ws = WSConnection(ConnectionType.SERVER)
    while True:
        try:
            events = await _handshake_events(stream, ws)
        except RemoteProtocolError as error:
            if error.event_hint is not None:  # a 400 that says what was wrong
                await stream.send_all(ws.send(error.event_hint))
            raise trio.BrokenResourceError(f"not a WebSocket handshake: {error}") from None
        for event in events:
            if isinstance(event, Request):
                handler = route(event.target)
                if handler is None:
                    reject = RejectConnection(status_code=403, has_body=True)
                    body = RejectData(b"no such WebSocket route", body_finished=True)
                    await stream.send_all(ws.send(reject) + ws.send(body))
                    return None
                await stream.send_all(ws.send(AcceptConnection()))
                return handler, WebSocket(stream, ws, max_message)
