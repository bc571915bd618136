"""A WebSocket driven by wsproto in the tasks that use it (`node/websocket.py`), against a raw
wsproto peer over an in-memory stream, and against itself over loopback."""

from __future__ import annotations

from contextlib import suppress
from functools import partial

import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed, ConnectionRejected
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    Request,
    TextMessage,
)

from sluicegate.node.websocket import WebSocket, accept_handshake, dial

TIMEOUT = 10


class Peer:
    """A client's end, in raw wsproto: what it sends and what it receives, event by event."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)

    async def send(self, *events) -> None:
        await self.stream.send_all(b"".join(self.ws.send(event) for event in events))

    async def next_event(self):
        while True:
            for event in self.ws.events():
                return event
            self.ws.receive_data(await self.stream.receive_some(65536) or None)


async def accepted_pair(max_message: int = 1000) -> tuple[Peer, WebSocket]:
    client, server = trio.testing.memory_stream_pair()
    peer = Peer(client)
    await peer.send(Request(host="node", target="/ws?x=1"))
    accepted = await accept_handshake(server, lambda target: target, max_message)
    assert accepted is not None
    target, websocket = accepted
    assert target == "/ws?x=1"
    assert isinstance(await peer.next_event(), AcceptConnection)
    return peer, websocket


async def closed_both_ways_with(code: int, peer: Peer, websocket: WebSocket) -> None:
    """The node's end raises `ConnectionClosed` with `code`, and sent the peer a close with it."""
    with pytest.raises(ConnectionClosed) as closed:
        await websocket.get_message()
    assert closed.value.reason.code == code
    event = await peer.next_event()
    assert isinstance(event, CloseConnection) and event.code == code


async def test_messages_in_several_frames_arrive_whole_and_in_order():
    with trio.fail_after(TIMEOUT):
        peer, websocket = await accepted_pair()
        await peer.send(
            BytesMessage(b"ab", message_finished=False),
            BytesMessage(b"cd", message_finished=True),
            TextMessage("text"),
            BytesMessage(b"one"),
        )
        assert [await websocket.get_message() for _ in range(3)] == [b"abcd", "text", b"one"]
        await websocket.send_message(b"back")
        event = await peer.next_event()
        assert isinstance(event, BytesMessage) and event.data == b"back"


async def test_a_message_over_the_bound_closes_the_connection_with_1009():
    with trio.fail_after(TIMEOUT):
        peer, websocket = await accepted_pair(max_message=10)
        await peer.send(
            BytesMessage(b"x" * 6, message_finished=False),
            BytesMessage(b"x" * 6, message_finished=True),
        )
        await closed_both_ways_with(1009, peer, websocket)


async def test_a_message_refused_from_its_header_is_read_to_its_senders_close_before_closing():
    """Closed over the unread rest of the message, a socket is reset, and the reset can
    overtake the close frame (1006 instead of 1009 at the other end, on a busy machine)."""
    with trio.fail_after(TIMEOUT):
        peer, websocket = await accepted_pair(max_message=10)
        mask = bytes(4)  # (XOR with zeros: the payload as it is)
        await peer.stream.send_all(bytes((0x82, 0x80 | 20)) + mask + b"x" * 5)
        async with trio.open_nursery() as nursery:
            refused = trio.Event()

            async def read() -> None:
                with pytest.raises(ConnectionClosed) as closed:
                    await websocket.get_message()
                assert closed.value.reason.code == 1009
                refused.set()

            nursery.start_soon(read)
            event = await peer.next_event()
            assert isinstance(event, CloseConnection) and event.code == 1009
            await peer.stream.send_all(b"x" * 15)  # the rest: still read, not reset
            assert not refused.is_set()
            await peer.stream.send_all(bytes((0x88, 0x82)) + mask + (1009).to_bytes(2, "big"))
        assert refused.is_set()


async def test_a_ping_is_answered_where_it_is_read():
    with trio.fail_after(TIMEOUT):
        peer, websocket = await accepted_pair()
        await peer.send(Ping(b"p"), BytesMessage(b"after"))
        assert await websocket.get_message() == b"after"
        event = await peer.next_event()
        assert isinstance(event, Pong) and event.payload == b"p"


async def test_a_close_comes_after_the_messages_before_it_and_is_answered():
    with trio.fail_after(TIMEOUT):
        peer, websocket = await accepted_pair()
        await peer.send(BytesMessage(b"last"), CloseConnection(4401, "not a member"))
        assert await websocket.get_message() == b"last"
        with pytest.raises(ConnectionClosed) as closed:
            await websocket.get_message()
        assert (closed.value.reason.code, closed.value.reason.reason) == (4401, "not a member")
        assert isinstance(await peer.next_event(), CloseConnection)
        with pytest.raises(ConnectionClosed):
            await websocket.send_message(b"too late")


async def test_a_malformed_frame_closes_the_connection_with_1002():
    with trio.fail_after(TIMEOUT):
        peer, websocket = await accepted_pair()
        await peer.stream.send_all(b"\x82\x05hello")  # a client's frame must be masked
        await closed_both_ways_with(1002, peer, websocket)


async def test_a_request_that_is_no_websocket_handshake_is_answered_400():
    client, server = trio.testing.memory_stream_pair()
    with trio.fail_after(TIMEOUT):
        await client.send_all(b"GET /ws HTTP/1.1\r\nHost: node\r\n\r\n")
        with pytest.raises(trio.BrokenResourceError):
            await accept_handshake(server, lambda target: target, 1000)
        assert (await client.receive_some(65536)).startswith(b"HTTP/1.1 400")


async def test_a_connection_lost_without_a_close_is_closed_1006():
    with trio.fail_after(TIMEOUT):
        peer, websocket = await accepted_pair()
        await peer.stream.aclose()
        with pytest.raises(ConnectionClosed) as closed:
            await websocket.get_message()
        assert closed.value.reason.code == 1006


async def test_dial_and_accept_over_loopback_and_a_route_nothing_serves_is_refused_403(nursery):
    async def serve(stream: trio.SocketStream) -> None:
        accepted = await accept_handshake(stream, {"/cluster": "links"}.get, 1 << 20)
        if accepted is not None:
            _, websocket = accepted
            with suppress(ConnectionClosed):
                while True:
                    await websocket.send_message(await websocket.get_message())

    listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
    address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    with trio.fail_after(TIMEOUT):
        websocket = await dial(address, "/cluster", None, 1 << 20)
        await websocket.send_message(b"y" * 200_000)  # over several reads
        assert await websocket.get_message() == b"y" * 200_000
        await websocket.aclose()
        with pytest.raises(ConnectionRejected) as rejected:
            await dial(address, "/elsewhere", None, 1 << 20)
        assert rejected.value.status_code == 403


async def test_only_a_plain_socket_takes_a_message_without_waiting():
    with trio.fail_after(TIMEOUT):
        peer, websocket = await accepted_pair()
        assert not websocket.send_message_nowait(b"over a stream trio writes")
        await websocket.send_message(b"sent by waiting")
        event = await peer.next_event()
        assert isinstance(event, BytesMessage) and event.data == b"sent by waiting"
