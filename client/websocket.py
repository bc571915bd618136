"""The client's WebSocket (RFC 6455): the opening handshake and frames, read by whoever asks.

What the client needs of the protocol and no more: binary messages (fragmented or not) up to
`MAX_MESSAGE`, ping answered with pong, the closing handshake. The framing is a sans-IO part
(`handshake_request`, `accept_handshake`, `FrameReader`, `frame`: bytes in, events or bytes
out) and a thin shell on anyio's byte streams (`WebSocket`, `open_websocket`), so under
asyncio and trio alike.

Why not trio-websocket here, as on the node: it reads each connection in a task of its own,
hands every message on through a memory channel, and takes a lock (a trip through the
scheduler) for every message sent; wsproto parses a frame through a chain of generators. A
client calling a node with many tasks spent about a third of its time there. Here the caller
of `get_message` reads the socket itself, and a frame is a few integer operations: reading a
small frame takes a seventh of wsproto's time, writing one a third (bench/websocket_framing.py).
tests/client/test_websocket_conformance.py holds the framing to wsproto's as the reference.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
from anyio.abc import ByteStream

MAX_MESSAGE = 1024 * 1024  # as trio-websocket's default, and the node's own frame limit
MAX_HANDSHAKE = 16 * 1024
RECEIVE_SIZE = 65536
CLOSE_TIMEOUT = 1.0
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CLOSE_NORMAL, CLOSE_PROTOCOL_ERROR, CLOSE_UNSUPPORTED, CLOSE_TOO_BIG = 1000, 1002, 1003, 1009
CLOSE_INVALID_DATA = 1007
# The codes a close frame may carry (RFC 6455 7.4, and IANA's registry); 3000-4999 are for
# libraries and applications.
_CLOSE_CODES = frozenset((1000, 1001, 1002, 1003, *range(1007, 1015)))


class WebSocketClosed(Exception):
    """The WebSocket is closed: by either side, or the connection broke."""


class HandshakeRefused(Exception):
    """The server did not accept the WebSocket."""


class ProtocolError(Exception):
    """The server broke the protocol; `code` is the close code to send."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


# -- sans-IO -----------------------------------------------------------------------------------


# RFC 9110's token (a header's name), and what a header's value may not hold.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_NOT_IN_VALUE = re.compile(r"[\x00\r\n]")
# Headers the handshake sets itself.
_OWN_HEADERS = {"host", "upgrade", "connection", "sec-websocket-key", "sec-websocket-version"}


def extra_headers(
    headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
) -> list[tuple[str, str]]:
    """The headers a client sends with its handshake beyond the protocol's own, checked."""
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
    for name, value in pairs:
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"not a header name: {name!r}")
        if name.lower() in _OWN_HEADERS:
            raise ValueError(f"the WebSocket handshake sets {name} itself")
        if not isinstance(value, str) or _NOT_IN_VALUE.search(value):
            raise ValueError(f"the value of {name} must be a string without CR, LF or NUL")
    return pairs


def handshake_request(
    host: str, target: str, headers: Sequence[tuple[str, str]] = ()
) -> tuple[bytes, bytes]:
    """The opening request, with `headers` (checked by `extra_headers`) besides the protocol's,
    and the accept value its answer must carry."""
    key = base64.b64encode(os.urandom(16))
    accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key.decode()}\r\n"
        f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
    ).encode()
    return request, accept


def accept_handshake(head: bytes, accept: bytes) -> None:
    """Check the server's answer (status line and headers, without the blank line)."""
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or parts[1] != "101":
        raise HandshakeRefused(f"the server answered {status_line!r}, not 101")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("upgrade", "").lower() != "websocket":
        raise HandshakeRefused("the server's answer does not upgrade to websocket")
    if "upgrade" not in headers.get("connection", "").lower():
        raise HandshakeRefused("the server's answer has no Connection: upgrade")
    if headers.get("sec-websocket-accept", "").encode() != accept:
        raise HandshakeRefused("the server's Sec-WebSocket-Accept is wrong")


def frame(opcode: int, payload: bytes, mask: bytes | None) -> bytes:
    """One final frame: from a client masked with `mask` (4 bytes), as RFC 6455 requires; from
    a server (`mask` None) not."""
    n = len(payload)
    bit = 0x80 if mask is not None else 0
    if n < 126:
        header = bytes((0x80 | opcode, bit | n))
    elif n < 65536:
        header = bytes((0x80 | opcode, bit | 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((0x80 | opcode, bit | 127)) + n.to_bytes(8, "big")
    if mask is None:
        return header + payload
    return header + mask + _masked(payload, mask)


def _masked(payload: bytes, mask: bytes) -> bytes:
    """`payload` XORed with `mask` repeated (masking and unmasking alike)."""
    n = len(payload)
    key = int.from_bytes(mask * (n // 4) + mask[: n % 4], "big")
    return (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")


@dataclass(frozen=True, slots=True)
class Message:
    data: bytes


@dataclass(frozen=True, slots=True)
class TextMessage:
    data: str


@dataclass(frozen=True, slots=True)
class Ping:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Close:
    code: int
    reason: str


class FrameReader:
    """Bytes from the server in (`feed`), events out (`next_event`): `Message`, `Ping`, `Close`;
    None while a frame is incomplete. Pongs are dropped. `ProtocolError` on a frame the server
    must not send (masked, reserved bits, text, a bad control frame, a message too big).

    `from_client`: the node's end, reading a client's frames, which must be masked, and may
    carry text (`TextMessage`, which the node refuses itself where it takes only binary)."""

    def __init__(self, max_message: int = MAX_MESSAGE, *, from_client: bool = False) -> None:
        self._buffer = bytearray()
        self._start = 0
        self._parts: list[bytes] = []
        self._size = 0
        self._max_message = max_message
        self._from_client = from_client
        self._mask_bit = 0x80 if from_client else 0
        # The opcode of the message whose fragments are coming (BINARY or TEXT), if any.
        self._opcode: int | None = None
        # Bytes of a frame refused for its size still to drop (`next_event` drops them first).
        self._skip = 0

    def feed(self, data: bytes) -> None:
        if self._start:
            del self._buffer[: self._start]
            self._start = 0
        self._buffer += data

    def next_event(self) -> Message | TextMessage | Ping | Close | None:
        """The next event, or None until more bytes come. After a `ProtocolError` for a message
        too big, the rest of its frame is dropped and what follows is read (the sender's close,
        say); after any other, nothing can be read."""
        while True:
            if self._skip:
                dropped = min(self._skip, len(self._buffer) - self._start)
                self._start += dropped
                self._skip -= dropped
                if self._skip:
                    return None
            buffer, start = self._buffer, self._start
            if len(buffer) - start < 2:
                return None
            first, second = buffer[start], buffer[start + 1]
            length, offset = second & 0x7F, start + 2
            if length == 126:
                if len(buffer) - start < 4:
                    return None
                length, offset = int.from_bytes(buffer[offset : offset + 2], "big"), offset + 2
                if length < 126:
                    raise ProtocolError(CLOSE_PROTOCOL_ERROR, "a length not in its shortest form")
            elif length == 127:
                if len(buffer) - start < 10:
                    return None
                length, offset = int.from_bytes(buffer[offset : offset + 8], "big"), offset + 8
                if length < 65536 or length >> 63:
                    raise ProtocolError(CLOSE_PROTOCOL_ERROR, "a length not in its shortest form")
            if first & 0x70 or second & 0x80 != self._mask_bit:
                raise ProtocolError(
                    CLOSE_PROTOCOL_ERROR,
                    "reserved bits or an unmasked frame"
                    if self._from_client
                    else "reserved bits or a masked frame",
                )
            opcode, final = first & 0x0F, first & 0x80
            if opcode >= CLOSE and (length > 125 or not final):
                raise ProtocolError(CLOSE_PROTOCOL_ERROR, "a control frame too long or in parts")
            if opcode < CLOSE and self._size + length > self._max_message:
                self._start = offset
                self._skip = length + (4 if self._from_client else 0)
                self._opcode, self._parts, self._size = None, [], 0
                raise ProtocolError(CLOSE_TOO_BIG, f"a message over {self._max_message} bytes")
            if self._from_client:
                if len(buffer) < offset + 4 + length:
                    return None
                mask, offset = bytes(buffer[offset : offset + 4]), offset + 4
                payload = _masked(bytes(buffer[offset : offset + length]), mask)
            else:
                if len(buffer) < offset + length:
                    return None
                payload = bytes(buffer[offset : offset + length])
            self._start = offset + length
            event = self._take(opcode, bool(final), payload)
            if event is not None:
                return event

    def _take(
        self, opcode: int, final: bool, payload: bytes
    ) -> Message | TextMessage | Ping | Close | None:
        if opcode == TEXT and not self._from_client:
            raise ProtocolError(CLOSE_UNSUPPORTED, "binary messages only")
        if opcode == BINARY or opcode == TEXT or opcode == CONTINUATION:
            if (opcode == CONTINUATION) != (self._opcode is not None):
                raise ProtocolError(CLOSE_PROTOCOL_ERROR, "a message fragment out of order")
            if final and self._opcode is None:
                return _message(opcode, payload)
            self._opcode = self._opcode or opcode
            self._parts.append(payload)
            self._size += len(payload)
            if not final:
                return None
            data = b"".join(self._parts)
            opcode, self._opcode, self._parts, self._size = self._opcode, None, [], 0
            return _message(opcode, data)
        if opcode == PING:
            return Ping(payload)
        if opcode == PONG:
            return None
        if opcode == CLOSE:
            return _close(payload)
        raise ProtocolError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode}")


def _message(opcode: int, data: bytes) -> Message | TextMessage:
    if opcode == BINARY:
        return Message(data)
    try:
        return TextMessage(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ProtocolError(CLOSE_INVALID_DATA, "a text message that is not UTF-8") from None


def close_payload(code: int, reason: str) -> bytes:
    """A close frame's body: the code, then the reason cut to fit a control frame."""
    return code.to_bytes(2, "big") + reason.encode()[:123]


def _close(payload: bytes) -> Close:
    """A close frame's body: none (1005, "no status"), or a code that may be sent and a UTF-8
    reason."""
    if not payload:
        return Close(1005, "")
    if len(payload) == 1:
        raise ProtocolError(CLOSE_PROTOCOL_ERROR, "a close frame with a one-byte body")
    code = int.from_bytes(payload[:2], "big")
    if code not in _CLOSE_CODES and not 3000 <= code <= 4999:
        raise ProtocolError(CLOSE_PROTOCOL_ERROR, f"a close frame with code {code}")
    try:
        return Close(code, payload[2:].decode("utf-8"))
    except UnicodeDecodeError:
        raise ProtocolError(CLOSE_INVALID_DATA, "a close reason that is not UTF-8") from None


# -- the shell -----------------------------------------------------------------------------------

# What a broken or closed stream raises.
_BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


class WebSocket:
    """An open WebSocket. `get_message` is for one caller at a time (the client's reading
    baton); sends may overlap (a pong while a message goes out)."""

    def __init__(self, stream: ByteStream, reader: FrameReader) -> None:
        self._stream = stream
        self._reader = reader
        self._send_lock = anyio.Lock()
        self.closed: str | None = None  # why, once closed
        self.close_code: int | None = None  # the server's, if it closed

    async def send_message(self, message: bytes) -> None:
        if self.closed is not None:
            raise WebSocketClosed(self.closed)
        await self._send(frame(BINARY, message, os.urandom(4)))

    async def get_message(self) -> bytes:
        while True:
            if self.closed is not None:
                raise WebSocketClosed(self.closed)
            try:
                event = self._reader.next_event()
            except ProtocolError as error:
                why = f"the server broke the protocol: {error}"
                await self._close(error.code, error.reason, why)
                continue
            if isinstance(event, Message):
                return event.data
            if isinstance(event, Ping):
                await self._send(frame(PONG, event.payload, os.urandom(4)))
            elif isinstance(event, Close):
                self.close_code = event.code
                code = 1000 if event.code == 1005 else event.code
                await self._close(code, "", f"closed by the server ({event.code} {event.reason})")
            else:
                try:
                    data = await self._stream.receive(RECEIVE_SIZE)
                except anyio.EndOfStream:
                    why = "the server closed the connection"
                except (anyio.BrokenResourceError, anyio.ClosedResourceError) as error:
                    why = f"the connection broke: {error!r}"
                else:
                    self._reader.feed(data)
                    continue
                self.closed = self.closed or why
                await anyio.aclose_forcefully(self._stream)

    async def aclose(self) -> None:
        if self.closed is None:
            await self._close(CLOSE_NORMAL, "", "closed by the client")
        else:
            await anyio.aclose_forcefully(self._stream)

    async def _close(self, code: int, reason: str, why: str) -> None:
        """Send a close frame (as far as the socket takes it in `CLOSE_TIMEOUT`), then close."""
        self.closed = self.closed or why
        try:
            with anyio.move_on_after(CLOSE_TIMEOUT):
                await self._send(frame(CLOSE, close_payload(code, reason), os.urandom(4)))
        except WebSocketClosed:
            pass
        finally:
            await anyio.aclose_forcefully(self._stream)

    async def _send(self, data: bytes) -> None:
        # The usual case, nobody else sending, without a trip through the scheduler.
        try:
            self._send_lock.acquire_nowait()
        except anyio.WouldBlock:
            await self._send_lock.acquire()
        try:
            await self._stream.send(data)
        except _BROKEN as error:
            self.closed = self.closed or f"the connection broke: {error!r}"
            raise WebSocketClosed(self.closed) from None
        finally:
            self._send_lock.release()


# How a client opens a WebSocket to a URL: `open_websocket`, or a simulated network's.
OpenWebSocket = Callable[[str], Awaitable["WebSocket"]]


async def open_websocket(
    url: str,
    ssl_context: ssl.SSLContext | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> WebSocket:
    """Open a WebSocket to `url` (`ws://` or `wss://`), sending `headers` (checked by
    `extra_headers`) with the handshake. Not bounded in time: the caller is."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a WebSocket URL: {url!r}")
    secure = parts.scheme == "wss"
    port = parts.port or (443 if secure else 80)
    if secure:
        stream: ByteStream = await anyio.connect_tcp(
            parts.hostname,
            port,
            ssl_context=ssl_context or ssl.create_default_context(),
            tls_standard_compatible=False,  # the WebSocket's close ends the conversation
        )
    else:
        stream = await anyio.connect_tcp(parts.hostname, port)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return await handshake(stream, parts.netloc.rsplit("@", 1)[-1], target, headers)


async def handshake(
    stream: ByteStream, host: str, target: str, headers: Sequence[tuple[str, str]] = ()
) -> WebSocket:
    """The opening handshake over `stream` (closed if it fails)."""
    try:
        request, accept = handshake_request(host, target, headers)
        await stream.send(request)
        received = b""
        while b"\r\n\r\n" not in received:
            if len(received) > MAX_HANDSHAKE:
                raise HandshakeRefused("the server's answer to the handshake is too long")
            try:
                received += await stream.receive(RECEIVE_SIZE)
            except anyio.EndOfStream:
                raise HandshakeRefused(
                    "the server closed the connection during the handshake"
                ) from None
        head, _, rest = received.partition(b"\r\n\r\n")
        accept_handshake(head, accept)
        reader = FrameReader()
        reader.feed(rest)
        return WebSocket(stream, reader)
    except BaseException:
        await anyio.aclose_forcefully(stream)
        raise
