"""The node's one port (`node/listener.py`): WebSocket handshakes to node/websocket.py, the rest to
hypercorn, on real loopback sockets in this process."""

from __future__ import annotations

import time

import pytest
import trio
from hypercorn.config import Config
from trio_websocket import HandshakeError, open_websocket_url

from sluicegate.node import listener

TIMEOUT = 10


async def asgi_app(scope, receive, send) -> None:
    """Answers HTTP with "asgi"; echoes a WebSocket that reached it, prefixed with "asgi:"."""
    if scope["type"] == "http":
        headers = [(b"content-length", b"4")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"asgi"})
    elif scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "bytes": b"asgi:" + message["bytes"]})


async def direct_echo(websocket) -> None:
    while True:
        await websocket.send_message(b"direct:" + await websocket.get_message())


# The paths `route` was asked for: what node/websocket.py (not hypercorn) took.
routed: list[str] = []


def route(path: str):
    routed.append(path)
    return direct_echo if path == "/ws" else None


async def start_listener(nursery, **options) -> tuple[int, trio.Event]:
    routed.clear()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 0.2
    stop = trio.Event()
    listeners, binds = listener.bind(config, tls="tls" in options)
    await nursery.start(
        lambda task_status: listener.serve(
            asgi_app,
            config,
            listeners,
            route,
            shutdown_trigger=stop.wait,
            task_status=task_status,
            **options,
        )
    )
    return int(binds[0].rsplit(":", 1)[1]), stop


@pytest.fixture
async def port(nursery):
    port, stop = await start_listener(nursery)
    yield port
    stop.set()


async def raw_exchange(port: int, *pieces: bytes, until: bytes = b"\r\n\r\n") -> bytes:
    """Send `pieces` (with a pause between them) on one socket; what comes back until `until`."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        for piece in pieces:
            await stream.send_all(piece)
            await trio.sleep(0.05)
        received = b""
        while until not in received:
            data = await stream.receive_some(65536)
            if not data:
                break
            received += data
        return received


async def test_a_websocket_to_ws_is_served_directly(port):
    with trio.fail_after(TIMEOUT):
        async with open_websocket_url(f"ws://127.0.0.1:{port}/ws") as ws:
            await ws.send_message(b"x" * 100_000)  # bigger than one read
            assert await ws.get_message() == b"direct:" + b"x" * 100_000


async def test_http_goes_to_hypercorn(port):
    with trio.fail_after(TIMEOUT):
        answer = await raw_exchange(port, b"GET /ws/x HTTP/1.1\r\nHost: a\r\n\r\n", until=b"asgi")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"asgi")
    assert routed == []


async def test_a_request_line_split_over_packets_is_still_recognised(port):
    handshake = (
        b"/ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with trio.fail_after(TIMEOUT):
        answer = await raw_exchange(port, b"GE", b"T ", handshake)
    assert answer.startswith(b"HTTP/1.1 101")
    assert routed == ["/ws"]


async def test_a_websocket_nothing_serves_is_refused(port):
    with trio.fail_after(TIMEOUT):
        with pytest.raises(HandshakeError):
            async with open_websocket_url(f"ws://127.0.0.1:{port}/cluster"):
                pass


async def test_a_websocket_after_a_request_on_a_kept_alive_connection_reaches_the_app(port):
    with trio.fail_after(TIMEOUT):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
            received = b""
            while b"asgi" not in received:
                received += await stream.receive_some(65536)
            await stream.send_all(
                b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            received = b""
            while b"\r\n\r\n" not in received:
                received += await stream.receive_some(65536)
    assert received.startswith(b"HTTP/1.1 101")
    assert routed == []


async def test_a_connection_that_says_nothing_is_handed_to_hypercorn_in_the_end(port, monkeypatch):
    monkeypatch.setattr(listener, "FIRST_BYTES_TIMEOUT", 0.2)
    with trio.fail_after(TIMEOUT):
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        # Meanwhile the port serves others.
        async with open_websocket_url(f"ws://127.0.0.1:{port}/ws") as ws:
            await ws.send_message(b"!")
            assert await ws.get_message() == b"direct:!"
        await trio.sleep(0.3)
        async with silent:
            await silent.send_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            received = b""
            while b"asgi" not in received:
                received += await silent.receive_some(65536)


async def test_connections_that_stop_mid_request_line_cost_no_cpu_while_they_wait(port):
    with trio.fail_after(TIMEOUT):
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(100)]
        for stream in idle:
            await stream.send_all(b"GET /")  # could still become `GET /ws ` or `GET /cluster`
        await trio.sleep(0.1)
        cpu = time.process_time()
        await trio.sleep(1.0)
        # Re-reading what they sent every millisecond took a whole core here.
        assert time.process_time() - cpu < 0.2
        answer = await raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n", until=b"asgi")
        assert answer.startswith(b"HTTP/1.1 200")
        for stream in idle:
            await stream.aclose()


async def test_a_connection_past_the_limit_is_answered_503_and_closed(nursery):
    port, stop = await start_listener(nursery, max_connections=3)
    with trio.fail_after(TIMEOUT):
        held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]
        await trio.sleep(0.1)
        answer = await raw_exchange(
            port, b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n", until=b"retry."
        )
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert answer.endswith(b"holds at most 3 at once ([limits] connections); retry.")
        await held.pop().aclose()
        await trio.sleep(0.1)
        answer = await raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n", until=b"asgi")
        assert answer.startswith(b"HTTP/1.1 200"), answer
        for stream in held:
            await stream.aclose()
    stop.set()


async def test_shutdown_ends_open_websockets_within_the_graceful_timeout(nursery):
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 0.2
    stop = trio.Event()
    stopped = trio.Event()

    listeners, binds = listener.bind(config, tls=False)

    async def serve_until_stopped(task_status) -> None:
        await listener.serve(
            asgi_app, config, listeners, route, shutdown_trigger=stop.wait, task_status=task_status
        )
        stopped.set()

    await nursery.start(serve_until_stopped)
    with trio.fail_after(TIMEOUT):
        async with open_websocket_url(f"{binds[0].replace('http', 'ws')}/ws") as ws:
            await ws.send_message(b"!")
            await ws.get_message()
            stop.set()
            await stopped.wait()
