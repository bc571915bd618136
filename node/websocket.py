"""A WebSocket over a trio stream, framed in the tasks that use it.

trio-websocket runs a reader task per connection that hands each message to the reader through
a memory channel: two task switches and a channel per message received, and a lock per message
sent. A node link and a `/ws` connection have one task that receives and one that sends, so
here the receiving task reads the socket and parses frames itself, and a message sent is one
`send_all`. Control frames are answered where they are read: a ping gets its pong, a close its
close. The interface is trio-websocket's (`send_message`, `get_message`, `aclose`,
`ConnectionClosed` with its `CloseReason`), so the links and the `/ws` shell are written
against one kind of connection, whichever serves it (`node/asgi_websocket.py` is the other).

The frames and the client's side of the opening handshake are our client's sans-IO framing
(`sluicegate.client.websocket`), which reads a small frame in a seventh of wsproto's time and
writes one in a third (bench/websocket_framing.py), held to wsproto's behaviour by
tests/client/test_websocket_conformance.py; the server's side reads the request with h11.

`dial` opens one to another node; `accept_handshake` takes one that a client opened.
"""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

import h11
import trio
from trio_websocket import CloseReason, ConnectionClosed, ConnectionRejected, HandshakeError

from sluicegate.client.websocket import (
    BINARY,
    CLOSE,
    CLOSE_TOO_BIG,
    MAX_HANDSHAKE,
    PONG,
    TEXT,
    Close,
    FrameReader,
    HandshakeRefused,
    Message,
    Ping,
    ProtocolError,
    TextMessage,
    close_payload,
    frame,
    handshake_request,
)
from sluicegate.client.websocket import (
    accept_handshake as check_answer,
)

from .quick_socket import RECEIVE_BYTES, QuickSocketStream, quick

# How long a refused connection's other end may go on sending before its socket is closed.
CLOSE_TIMEOUT = 1.0
# Close codes (RFC 6455): none was given, and no close frame came.
NO_STATUS = 1005
ABNORMAL = 1006
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

H = TypeVar("H")


class WebSocket:
    """An open WebSocket: `reader` has what arrived so far; `client`, the end that dialled
    (its frames are masked)."""

    def __init__(self, stream: trio.abc.Stream, reader: FrameReader, client: bool) -> None:
        self._stream = quick(stream)
        self._reader = reader
        self._client = client
        self._send_lock = trio.Lock()
        # The end of a frame `send_message_nowait` wrote in part: written first by the next
        # send, or by `drain`.
        self._tail = b""
        self.closed: CloseReason | None = None

    async def send_message(self, message: bytes | str) -> None:
        if isinstance(message, bytes):
            await self._send(BINARY, message)
        else:
            await self._send(TEXT, message.encode())

    def send_message_nowait(self, message: bytes) -> bool:
        """Send `message` from this task, without waiting, if the connection is plain TCP and
        nobody is sending on it; whether it was sent. What the socket does not take at once
        stays behind (`draining`) until the next send or `drain`: sent, all the same, in order.
        `ConnectionClosed` if the connection is lost."""
        stream = self._stream
        if (
            self._tail
            or self._send_lock.locked()
            or self.closed is not None
            or not isinstance(stream, QuickSocketStream)
        ):
            return False
        data = frame(BINARY, message, os.urandom(4) if self._client else None)
        try:
            written = stream.send_nowait(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._lost()
            raise ConnectionClosed(self.closed) from None
        self._tail = data[written:]
        return True

    @property
    def draining(self) -> bool:
        """Part of a frame sent without waiting is still to be written (`drain`)."""
        return bool(self._tail)

    async def drain(self) -> None:
        """Write what `send_message_nowait` left behind."""
        await self._send(BINARY, None)

    async def get_message(self) -> bytes | str:
        """The next message; `ConnectionClosed` once none is left and the connection closed."""
        while True:
            try:
                event = self._reader.next_event()
            except ProtocolError as error:
                await self._refuse(error)
                raise ConnectionClosed(self.closed) from None
            if isinstance(event, Message | TextMessage):
                return event.data
            if isinstance(event, Ping):
                await self._send_control(PONG, event.payload)
            elif isinstance(event, Close):
                await self._closed_by_the_other_end(event)
                raise ConnectionClosed(self.closed)  # nothing after a close counts
            elif self.closed is not None:
                raise ConnectionClosed(self.closed)
            else:
                try:
                    data = await _receive(self._stream)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
                if data:
                    self._reader.feed(data)
                else:
                    self._lost()

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        """Send a close frame (unless the connection closed already) and close the stream."""
        try:
            if self.closed is None:
                self.closed = CloseReason(code, reason)
                await self._send_frame(CLOSE, close_payload(code, reason or ""))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await self._stream.aclose()

    async def _refuse(self, error: ProtocolError) -> None:
        """Close for what the other end broke: our close frame, then what it still sends (the
        rest of a message refused from its header) is read and dropped until its close frame
        (where the reader can still find frames: after a message too big) or its end of the
        stream, for `CLOSE_TIMEOUT` at most. A socket closed over unread bytes is reset, and
        the reset can overtake the close frame: the other end saw 1006 instead of 1009 on a
        busy machine."""
        self.closed = CloseReason(error.code, error.reason)
        readable = error.code == CLOSE_TOO_BIG
        try:
            await self._send_frame(CLOSE, close_payload(error.code, error.reason))
            with trio.move_on_after(CLOSE_TIMEOUT):
                while not (readable and isinstance(self._next_or_none(), Close)):
                    data = await _receive(self._stream)
                    if not data:
                        break
                    self._reader.feed(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await self._stream.aclose()

    def _next_or_none(self) -> object:
        """The reader's next event past what it can read now, dropping messages and pings;
        None when it needs more bytes or cannot read on."""
        try:
            while (event := self._reader.next_event()) is not None:
                if isinstance(event, Close):
                    return event
        except ProtocolError:
            pass
        return None

    async def _closed_by_the_other_end(self, close: Close) -> None:
        if self.closed is None:
            self.closed = CloseReason(close.code, close.reason or None)
            body = b"" if close.code == NO_STATUS else close_payload(close.code, close.reason)
            await self._send_control(CLOSE, body)
        await self._stream.aclose()

    async def _send(self, opcode: int, payload: bytes | None) -> None:
        if self.closed is not None:
            raise ConnectionClosed(self.closed)
        try:
            await self._send_frame(opcode, payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._lost()
            raise ConnectionClosed(self.closed) from None

    async def _send_control(self, opcode: int, payload: bytes) -> None:
        """A pong or a close answered: the other end may have gone already."""
        try:
            await self._send_frame(opcode, payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._lost()

    def _lost(self) -> None:
        if self.closed is None:
            self.closed = CloseReason(ABNORMAL, "the connection was lost")

    async def _send_frame(self, opcode: int, payload: bytes | None) -> None:
        """Send a frame (none if `payload` is None), after the tail of one sent in part."""
        data = (
            b""
            if payload is None
            else frame(opcode, payload, os.urandom(4) if self._client else None)
        )
        # The usual case, nobody else sending, without a trip through the scheduler.
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            if self._tail:
                data, self._tail = self._tail + data, b""
            if data:
                await self._stream.send_all(data)
        finally:
            self._send_lock.release()


async def _send_all(stream: trio.abc.Stream, data: bytes) -> None:
    """A handshake's bytes sent; a stream closed under this end is broken (as in `_receive`)."""
    try:
        await stream.send_all(data)
    except trio.ClosedResourceError:
        raise trio.BrokenResourceError("the connection was closed") from None


async def _receive(stream: trio.abc.Stream) -> bytes:
    """What the stream has next; b"" once the other end closed it. A stream closed under this
    end (a connection severed by its owner while a handshake waits) is broken too."""
    try:
        data = await stream.receive_some(RECEIVE_BYTES)
    except trio.ClosedResourceError:
        raise trio.BrokenResourceError("the connection was closed") from None
    return data if isinstance(data, bytes) else bytes(data)


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
    return await handshake(stream, address, path, max_message)


async def handshake(
    stream: trio.abc.Stream, address: str, path: str, max_message: int
) -> WebSocket:
    """The client's side of the opening handshake over `stream` (closed if it fails), as
    `dial` describes."""
    try:
        request, accept = handshake_request(address, path)
        await _send_all(stream, request)
        head, rest = await _answer_head(stream, address)
        status = _status(head, address)
        if status != 101:
            raise ConnectionRejected(status, (), None)
        try:
            check_answer(head, accept)
        except HandshakeRefused as error:
            raise HandshakeError(f"{address} answered no WebSocket: {error}") from None
        reader = FrameReader(max_message)
        reader.feed(rest)
        return WebSocket(stream, reader, client=True)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


async def _answer_head(stream: trio.abc.Stream, address: str) -> tuple[bytes, bytes]:
    """The server's answer up to its blank line, and what came after it."""
    received = b""
    while b"\r\n\r\n" not in received:
        if len(received) > MAX_HANDSHAKE:
            raise HandshakeError(f"{address} answered the handshake at too great a length")
        data = await _receive(stream)
        if not data:
            raise trio.BrokenResourceError("closed during the WebSocket handshake")
        received += data
    head, _, rest = received.partition(b"\r\n\r\n")
    return head, rest


def _status(head: bytes, address: str) -> int:
    version, _, rest = head.partition(b"\r\n")[0].partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or not code.isdigit() or len(code) != 3:
        raise HandshakeError(f"{address} answered no WebSocket: no HTTP status line")
    return int(code)


async def accept_handshake(
    stream: trio.abc.Stream, route: Callable[[str], H | None], max_message: int
) -> tuple[H, WebSocket] | None:
    """Read a client's opening handshake from `stream`, and accept it if `route` gives
    something for its target (path and query): that, and the WebSocket. Else it is answered 403,
    and None returned. Raises `trio.BrokenResourceError` if the client goes before it asked, or
    asks for something else than a WebSocket (answered 400, saying why)."""
    http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HANDSHAKE)
    try:
        request = await _request(stream, http)
        problem = _not_an_upgrade(request)
    except h11.RemoteProtocolError as error:
        request, problem = None, f"not HTTP: {error}"
    if request is None or problem:
        await _send_all(stream, _refusal(400, problem or "no request"))
        raise trio.BrokenResourceError(f"not a WebSocket handshake: {problem}")
    handler = route(request.target.decode("latin-1"))
    if handler is None:
        await _send_all(stream, _refusal(403, "no such WebSocket route"))
        return None
    key = dict(request.headers)[b"sec-websocket-key"]
    accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
    await _send_all(
        stream,
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n",
    )
    reader = FrameReader(max_message, from_client=True)
    reader.feed(http.trailing_data[0])
    return handler, WebSocket(stream, reader, client=False)


async def _request(stream: trio.abc.Stream, http: h11.Connection) -> h11.Request:
    while True:
        event = http.next_event()
        if isinstance(event, h11.Request):
            return event
        if event is not h11.NEED_DATA:
            raise trio.BrokenResourceError("closed during the WebSocket handshake")
        data = await _receive(stream)
        if not data:
            raise trio.BrokenResourceError("closed during the WebSocket handshake")
        http.receive_data(data)


def _not_an_upgrade(request: h11.Request) -> str | None:
    """Why `request` is no WebSocket opening handshake (RFC 6455 4.2.1), if it is not."""
    headers = {name: value for name, value in request.headers}
    connection = {token.strip().lower() for token in headers.get(b"connection", b"").split(b",")}
    if request.method != b"GET":
        return "the method must be GET"
    if b"upgrade" not in connection:
        return "no Connection: Upgrade"
    if headers.get(b"upgrade", b"").lower() != b"websocket":
        return "no Upgrade: websocket"
    if headers.get(b"sec-websocket-version") != b"13":
        return "no Sec-WebSocket-Version: 13"
    if b"sec-websocket-key" not in headers:
        return "no Sec-WebSocket-Key"
    return None


def _refusal(status: int, why: str) -> bytes:
    body = why.encode()
    reason = {400: b"Bad Request", 403: b"Forbidden"}[status]
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (status, reason, len(body), body)
    )
