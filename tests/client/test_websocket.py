"""The client's own WebSocket: its framing without a network, then against trio-websocket's
server (the node's) over loopback."""

from __future__ import annotations

import functools

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from trio_websocket import ConnectionClosed, serve_websocket

from sluicegate.client import websocket
from sluicegate.client.websocket import (
    Close,
    FrameReader,
    HandshakeRefused,
    Message,
    Ping,
    ProtocolError,
    WebSocketClosed,
)

TIMEOUT = 10


def server_frame(opcode: int, payload: bytes, final: bool = True, first: int = 0) -> bytes:
    """A frame as a server sends it (not masked)."""
    n = len(payload)
    head = bytes(((0x80 if final else 0) | first | opcode,))
    if n < 126:
        return head + bytes((n,)) + payload
    if n < 65536:
        return head + bytes((126,)) + n.to_bytes(2, "big") + payload
    return head + bytes((127,)) + n.to_bytes(8, "big") + payload


def unmask(data: bytes) -> tuple[int, bytes]:
    """A client frame's opcode and payload, checking that it is final and masked."""
    assert data[0] & 0x80 and data[1] & 0x80
    n, offset = data[1] & 0x7F, 2
    if n == 126:
        n, offset = int.from_bytes(data[2:4], "big"), 4
    elif n == 127:
        n, offset = int.from_bytes(data[2:10], "big"), 10
    mask, payload = data[offset : offset + 4], data[offset + 4 :]
    assert len(payload) == n
    return data[0] & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def events(reader: FrameReader) -> list:
    found = []
    while (event := reader.next_event()) is not None:
        found.append(event)
    return found


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70001])
def test_client_frames_are_masked_and_sized_at_every_length_boundary(size):
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    data = websocket.frame(websocket.BINARY, payload, b"\x01\x80\xff\x33")
    assert unmask(data) == (websocket.BINARY, payload)


@settings(max_examples=200, deadline=None)
@given(
    messages=st.lists(st.binary(max_size=300), max_size=6),
    big=st.booleans(),
    fragment=st.integers(1, 200),
    chunk=st.integers(1, 300),
    pings=st.booleans(),
)
def test_messages_come_out_whole_however_they_are_fragmented_and_read(
    messages, big, fragment, chunk, pings
):
    if big:  # lengths in 16 and 64 bits; fragments and reads scaled up to keep the test quick
        messages = [*messages, bytes(range(256)) * 300]
        fragment, chunk = fragment * 500, chunk * 100
    wire = b""
    for message in messages:
        parts = [message[i : i + fragment] for i in range(0, len(message), fragment)] or [b""]
        for number, part in enumerate(parts):
            opcode = websocket.BINARY if number == 0 else websocket.CONTINUATION
            wire += server_frame(opcode, part, final=number == len(parts) - 1)
            if pings and number == 0:
                wire += server_frame(websocket.PING, b"p") + server_frame(websocket.PONG, b"")
    reader = FrameReader()
    found = []
    for start in range(0, len(wire), chunk):
        reader.feed(wire[start : start + chunk])
        found += events(reader)
    assert [e.data for e in found if isinstance(e, Message)] == messages
    assert all(e == Ping(b"p") for e in found if not isinstance(e, Message))
    assert reader.next_event() is None


def test_close_frames_carry_their_code_and_reason():
    reader = FrameReader()
    reader.feed(server_frame(websocket.CLOSE, (4001).to_bytes(2, "big") + b"bye"))
    reader.feed(server_frame(websocket.CLOSE, b""))
    assert events(reader) == [Close(4001, "bye"), Close(1005, "")]


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (server_frame(websocket.TEXT, b"hi"), websocket.CLOSE_UNSUPPORTED),
        (server_frame(websocket.BINARY, b"x", first=0x40), websocket.CLOSE_PROTOCOL_ERROR),
        (b"\x82\x81abcdx", websocket.CLOSE_PROTOCOL_ERROR),  # masked
        (server_frame(websocket.PING, b"x" * 126), websocket.CLOSE_PROTOCOL_ERROR),
        (server_frame(websocket.PING, b"x", final=False), websocket.CLOSE_PROTOCOL_ERROR),
        (server_frame(websocket.CONTINUATION, b"x"), websocket.CLOSE_PROTOCOL_ERROR),
        (
            server_frame(websocket.BINARY, b"x", final=False) + server_frame(websocket.BINARY, b""),
            websocket.CLOSE_PROTOCOL_ERROR,
        ),
        (server_frame(0x3, b""), websocket.CLOSE_PROTOCOL_ERROR),
        (server_frame(websocket.BINARY, bytes(websocket.MAX_MESSAGE + 1)), websocket.CLOSE_TOO_BIG),
        (
            server_frame(websocket.BINARY, bytes(websocket.MAX_MESSAGE), final=False)
            + server_frame(websocket.CONTINUATION, b"x"),
            websocket.CLOSE_TOO_BIG,
        ),
    ],
)
def test_frames_a_server_must_not_send_are_protocol_errors(wire, code):
    reader = FrameReader()
    reader.feed(wire)
    with pytest.raises(ProtocolError) as error:
        events(reader)
    assert error.value.code == code


def test_a_wrong_accept_or_status_refuses_the_handshake():
    request, accept = websocket.handshake_request("h:1", "/ws")
    assert request.startswith(b"GET /ws HTTP/1.1\r\nHost: h:1\r\n")
    good = b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept
    websocket.accept_handshake(b"HTTP/1.1 101 Switching Protocols\r\n" + good, accept)
    with pytest.raises(HandshakeRefused):
        websocket.accept_handshake(b"HTTP/1.1 403 Forbidden\r\n" + good, accept)
    with pytest.raises(HandshakeRefused):
        websocket.accept_handshake(b"HTTP/1.1 101 OK\r\n" + good[:-2] + b"xx", accept)


# -- against trio-websocket's server -----------------------------------------------------------


async def serve(nursery, handler) -> str:
    async def accept(request) -> None:
        if request.path != "/ws":
            await request.reject(403)
            return
        ws = await request.accept()
        try:
            await handler(ws)
        except ConnectionClosed:
            pass

    server = await nursery.start(serve_websocket, accept, "127.0.0.1", 0, None)
    return f"ws://127.0.0.1:{server.port}"


async def test_messages_of_every_size_go_both_ways_and_pings_are_answered(nursery):
    async def echo(ws) -> None:
        while True:
            message = await ws.get_message()
            await ws.ping(b"are you there")  # returns once the client's pong came
            await ws.send_message(message)

    url = await serve(nursery, echo)
    with trio.fail_after(TIMEOUT):
        ws = await websocket.open_websocket(url + "/ws")
        for size in (0, 1, 126, 65536, 300_000):
            message = bytes(range(256)) * (size // 256) + bytes(size % 256)
            await ws.send_message(message)
            assert await ws.get_message() == message
        await ws.aclose()
        assert ws.closed == "closed by the client"


async def test_a_close_from_the_server_is_answered_and_raised(nursery):
    closed = trio.Event()

    async def close_at_once(ws) -> None:
        await ws.aclose(4000, "go away")  # waits for the client's answer to the close
        closed.set()

    url = await serve(nursery, close_at_once)
    with trio.fail_after(TIMEOUT):
        ws = await websocket.open_websocket(url + "/ws")
        with pytest.raises(WebSocketClosed, match="4000 go away"):
            await ws.get_message()
        await closed.wait()
        with pytest.raises(WebSocketClosed):
            await ws.send_message(b"late")


async def test_a_text_message_closes_with_1003_and_a_refusal_is_no_websocket(nursery):
    close_code = []

    async def say_text(ws) -> None:
        await ws.send_message("text")
        try:
            await ws.get_message()
        except ConnectionClosed as closed:
            close_code.append(closed.reason.code)

    url = await serve(nursery, say_text)
    with trio.fail_after(TIMEOUT):
        ws = await websocket.open_websocket(url + "/ws")
        with pytest.raises(WebSocketClosed, match="binary messages only"):
            await ws.get_message()
        while not close_code:
            await trio.sleep(0.01)
        assert close_code == [1003]
        with pytest.raises(HandshakeRefused, match="403"):
            await websocket.open_websocket(url + "/elsewhere")


def test_extra_headers_are_checked():
    assert websocket.extra_headers({"X-Team": "crawlers"}) == [("X-Team", "crawlers")]
    request, _ = websocket.handshake_request("h:1", "/ws", [("X-Team", "crawlers")])
    assert request.endswith(b"Sec-WebSocket-Version: 13\r\nX-Team: crawlers\r\n\r\n")
    for bad in (
        [("X Team", "a")],  # not a token
        [("X-Team", "a\r\nInjected: yes")],
        [("Sec-WebSocket-Key", "mine")],  # the handshake's own
    ):
        with pytest.raises(ValueError):
            websocket.extra_headers(bad)


async def test_connect_verifies_wss_with_the_given_context_and_sends_headers_and_token(
    nursery, tmp_path
):
    import ssl
    import subprocess

    import msgpack

    from sluicegate import client as sg

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    command = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1"
    subprocess.run(
        [*command.split(), "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
        check=True,
        capture_output=True,
        timeout=TIMEOUT,
    )
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    seen = []

    async def accept(request) -> None:
        seen.append(dict(request.headers))
        ws = await request.accept()
        try:
            seen.append(msgpack.unpackb(await ws.get_message()))  # the hello
            await ws.send_message(msgpack.packb({"node": "tls-node"}))
            await ws.get_message()
        except ConnectionClosed:
            pass

    async def handshake_only(stream) -> None:
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError:
            pass  # the client refused the certificate

    plain_tls = await nursery.start(
        functools.partial(trio.serve_ssl_over_tcp, host="127.0.0.1"), handshake_only, 0, served
    )
    port = plain_tls[0].transport_listener.socket.getsockname()[1]
    server = await nursery.start(serve_websocket, accept, "127.0.0.1", 0, served)
    url = f"wss://127.0.0.1:{server.port}"
    with trio.fail_after(TIMEOUT):
        with pytest.raises(ssl.SSLCertVerificationError):  # by the system's authorities
            await websocket.open_websocket(f"wss://127.0.0.1:{port}/ws")
        trusted = ssl.create_default_context(cafile=str(cert))
        headers = {"X-Team": "crawlers"}
        async with await sg.connect(url, ssl_context=trusted, headers=headers, token="s3") as c:
            assert c.node == "tls-node"
    received = {name.lower(): value for name, value in seen[0].items()}
    assert received[b"x-team"] == b"crawlers" and b"authorization" not in received
    assert seen[1] == {"hello": 1, "token": "s3"}  # the token goes in the hello
