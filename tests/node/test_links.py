"""Node links over in-memory streams under trio's virtual clock.

pytest-trio only runs a test under a clock that the test itself asks for, hence `autojump_clock` in
every signature.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import trio
import trio.testing
from trio_websocket import CloseReason, ConnectionClosed, wrap_client_stream, wrap_server_stream

from sluicegate.client.websocket import FrameReader
from sluicegate.node.links import (
    ACCEPTOR,
    BACKOFF_MAX,
    CLOSE_UNAUTHORIZED,
    DIALER,
    HANDSHAKE_MESSAGES,
    OUTBOX_LIMIT,
    REFUSAL_LOG_INTERVAL,
    Challenge,
    Hello,
    Links,
    Welcome,
    proof_of_secret,
)
from sluicegate.node.websocket import WebSocket
from sluicegate.node.wire import Codec


@dataclass(frozen=True, slots=True)
class Note:
    text: str


CODEC = Codec({1: Note, **HANDSHAKE_MESSAGES})


class Network:
    """Nodes whose dialer opens an in-memory WebSocket to another node's `accept`."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.nodes: dict[str, Links] = {}
        self.received: dict[str, list[tuple[str, str]]] = {}
        self.frames: dict[str, int] = {}
        self.dials: list[tuple[str, float]] = []
        self.servers: list[object] = []
        self.streams: list[trio.testing.MemorySendStream] = []
        self.down: set[str] = set()

    def add(
        self,
        node_id: str,
        secret: bytes = b"s3cret",
        generation: int = 1,
        repeat=None,
        life_of=lambda remote_id: None,
    ) -> Links:
        self.received[node_id] = []
        self.frames[node_id] = 0

        async def deliver(remote_id: str, messages: list[object]) -> None:
            self.frames[node_id] += 1
            self.received[node_id].extend((remote_id, m.text) for m in messages)

        async def dial(connection_nursery: trio.Nursery, address: str):
            self.dials.append((address, trio.current_time()))
            if address in self.down:
                raise OSError("connection refused")
            client_stream, server_stream = trio.testing.memory_stream_pair()
            self.streams.append(server_stream)
            self.nursery.start_soon(self._serve, address, server_stream)
            return await wrap_client_stream(connection_nursery, client_stream, address, "/cluster")

        links = Links(
            node_id,
            secret,
            CODEC,
            dial,
            deliver,
            random.Random(node_id),
            generation,
            repeat=repeat,
            life_of=life_of,
        )
        self.nodes[node_id] = links
        return links

    async def _serve(self, address: str, stream) -> None:
        async with trio.open_nursery() as nursery:
            request = await wrap_server_stream(nursery, stream)
            conn = await request.accept()
            self.servers.append(conn)
            await self.nodes[address].accept(conn)
            await conn.aclose()
            nursery.cancel_scope.cancel()


@pytest.fixture
async def network(nursery):
    # A redial loop keeps the autojump clock moving, so a stuck test would never end by itself.
    with trio.fail_after(600):
        yield Network(nursery)


async def test_messages_flow_both_ways_over_one_connection(autojump_clock, network, nursery):
    a, b = network.add("a"), network.add("b")
    a.send("b", Note("queued before the link was up"))
    b.send("a", Note("from b"))
    assert a.dials("b") and not b.dials("a")
    nursery.start_soon(a.keep_linked, "b", "b")
    await trio.sleep(1)
    assert network.received["b"] == [("a", "queued before the link was up")]
    assert network.received["a"] == [("b", "from b")]
    assert len(network.dials) == 1
    assert a.status() == {"b": True}
    assert b.status() == {"a": True}


async def test_queued_messages_leave_in_one_frame(autojump_clock, network, nursery):
    a = network.add("a")
    network.add("b")
    for i in range(500):
        a.send("b", Note(f"m{i}"))
    nursery.start_soon(a.keep_linked, "b", "b")
    await trio.sleep(1)
    assert [text for _, text in network.received["b"]] == [f"m{i}" for i in range(500)]
    assert a.link("b").frames_sent == 1


async def test_a_wrong_secret_is_refused_and_retried_with_backoff(autojump_clock, network, nursery):
    network.add("a", secret=b"wrong")
    network.add("b")
    network.nodes["a"].send("b", Note("must not arrive"))
    nursery.start_soon(network.nodes["a"].keep_linked, "b", "b")
    await trio.sleep(30)
    assert network.received["b"] == []
    assert not network.nodes["a"].status()["b"]
    times = [t for _, t in network.dials]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert 5 < len(times) < 30
    assert gaps[-1] <= BACKOFF_MAX + 0.01
    assert max(gaps) > 2  # it backs off instead of hammering
    assert all(conn.closed.code == CLOSE_UNAUTHORIZED for conn in network.servers)


async def test_an_acceptor_that_cannot_prove_the_secret_is_not_believed(autojump_clock, nursery):
    """A rogue seed answers the challenge's form but not its proof: the dialer hangs up
    before any of the rogue's messages is delivered."""
    received = []
    rogue_closed = []

    async def deliver(remote_id: str, messages: list[object]) -> None:
        received.extend(messages)

    async def rogue(stream) -> None:
        async with trio.open_nursery() as nursery:
            conn = await (await wrap_server_stream(nursery, stream)).accept()
            await conn.send_message(CODEC.encode([Challenge("rogue", b"n" * 16)]))
            hello = CODEC.decode(await conn.get_message())[0]
            assert isinstance(hello, Hello)
            await conn.send_message(CODEC.encode([Welcome("rogue", 1, b"\0" * 32)]))
            await conn.send_message(CODEC.encode([Note("believe me")]))
            try:
                await conn.get_message()
            except ConnectionClosed as closed:
                rogue_closed.append(closed.reason.code)
            nursery.cancel_scope.cancel()

    async def dial(connection_nursery: trio.Nursery, address: str):
        client_stream, server_stream = trio.testing.memory_stream_pair()
        nursery.start_soon(rogue, server_stream)
        return await wrap_client_stream(connection_nursery, client_stream, address, "/cluster")

    a = Links("a", b"s3cret", CODEC, dial, deliver, random.Random(1), 1)
    assert await a.introduce("rogue:1", hold=5.0) is None
    await trio.testing.wait_all_tasks_blocked()
    assert received == []
    assert rogue_closed == [CLOSE_UNAUTHORIZED]


async def test_a_severed_link_is_redialled_and_queued_messages_follow(
    autojump_clock, network, nursery
):
    a = network.add("a")
    network.add("b")
    nursery.start_soon(a.keep_linked, "b", "b")
    a.send("b", Note("before"))
    await trio.sleep(1)
    network.down.add("b")
    await network.streams[-1].aclose()  # the connection breaks, as when a node dies
    await trio.sleep(0.01)
    a.send("b", Note("during"))
    await trio.sleep(3)
    assert not a.status()["b"]
    network.down.discard("b")
    await trio.sleep(10)
    assert a.status()["b"]
    assert network.received["b"] == [("a", "before"), ("a", "during")]


async def test_a_node_known_to_be_up_again_is_dialled_at_once_not_after_the_backoff(
    autojump_clock, network, nursery
):
    a = network.add("a")
    network.add("b")
    network.down.add("b")
    nursery.start_soon(a.keep_linked, "b", "b")
    await trio.sleep(20)  # the backoff is at its longest by now
    network.down.discard("b")
    a.send("b", Note("after the heal"))
    redialled_at = trio.current_time()
    a.redial("b")  # as when membership sees b up again
    await trio.sleep(0.01)
    assert a.status()["b"] and network.received["b"] == [("a", "after the heal")]
    assert network.dials[-1][1] == redialled_at
    a.redial("b")  # linked: nothing to wake


async def test_what_was_meant_for_a_node_before_it_restarted_is_not_delivered_after(
    autojump_clock, network, nursery
):
    a = network.add("a")
    network.add("b", generation=1)
    nursery.start_soon(a.keep_linked, "b", "b")
    await trio.sleep(1)
    assert a.link("b").connected
    network.down.add("b")
    await network.streams[-1].aclose()  # b dies
    await trio.sleep(0.01)
    a.send("b", Note("for b's first life"), generation=1)
    a.send("b", Note("for any life of b"))
    a.send("b", Note("for b's second life"), generation=2)
    await trio.sleep(3)
    network.add("b", generation=2)  # b restarts, its memory empty
    network.down.discard("b")
    await trio.sleep(10)
    assert a.status()["b"]
    assert network.received["b"] == [("a", "for any life of b"), ("a", "for b's second life")]
    assert a.link("b").stale == 1


async def test_the_repeat_seam_sends_a_message_twice_and_hears_which_life_it_goes_to(
    autojump_clock, network, nursery
):
    asked = []

    def repeat(remote_id, message, life):
        asked.append((remote_id, message.text, life))
        return message.text == "twice"

    a = network.add("a", repeat=repeat)
    network.add("b", generation=7)
    a.send("b", Note("before the link"))
    nursery.start_soon(a.keep_linked, "b", "b")
    await trio.sleep(1)
    a.send("b", Note("twice"))
    a.send("b", Note("once"), generation=7)
    await trio.sleep(1)
    assert [text for _, text in network.received["b"]] == [
        "before the link",
        "twice",
        "twice",
        "once",
    ]
    assert asked == [("b", "before the link", None), ("b", "twice", 7), ("b", "once", 7)]


async def test_what_a_life_older_than_the_one_the_membership_knows_says_is_dropped(
    autojump_clock, network, nursery
):
    """Bytes a crashed process left in the network may arrive after its next life was
    gossiped: none of them is that life's."""
    known = {"a": 1}
    network.add("a", generation=1)
    b = network.add("b", life_of=known.get)
    nursery.start_soon(network.nodes["a"].keep_linked, "b", "b")
    network.nodes["a"].send("b", Note("from a's first life"))
    await trio.sleep(1)
    known["a"] = 2  # gossip: a started again
    network.nodes["a"].send("b", Note("from a's first life, arriving late"))
    await trio.sleep(1)
    assert network.received["b"] == [("a", "from a's first life")]
    assert b.from_dead_lives == 1


async def test_a_malformed_frame_closes_the_link(autojump_clock, network, nursery):
    a = network.add("a")
    network.add("b")
    nursery.start_soon(a.keep_linked, "b", "b")
    await trio.sleep(1)
    [server_side] = network.servers
    await server_side.send_message(b"\xc1 not msgpack")
    await trio.sleep(0.5)
    assert network.received["a"] == []
    # The dialer notices, redials, and the pair is linked again.
    await trio.sleep(5)
    assert len(network.dials) == 2
    assert a.status()["b"]


async def test_dialing_the_wrong_node_is_refused(autojump_clock, network, nursery):
    a = network.add("a")
    network.add("c")
    nursery.start_soon(a.keep_linked, "b", "c")  # the address answers as "c"
    await trio.sleep(3)
    assert not a.status().get("b")
    assert network.received["c"] == []


def test_proofs_bind_the_role_the_nonce_and_both_ids():
    base = proof_of_secret(b"k", DIALER, b"nonce", "a", "b")
    assert base == proof_of_secret(b"k", DIALER, b"nonce", "a", "b")
    assert base != proof_of_secret(b"k", ACCEPTOR, b"nonce", "a", "b")
    assert base != proof_of_secret(b"k", DIALER, b"nonce", "b", "a")
    assert base != proof_of_secret(b"k", DIALER, b"other", "a", "b")
    assert base != proof_of_secret(b"x", DIALER, b"nonce", "a", "b")


async def test_flush_waits_until_queued_messages_are_sent(autojump_clock, network, nursery):
    a = network.add("a")
    network.add("b")
    nursery.start_soon(a.keep_linked, "b", "b")
    await trio.sleep(1)
    for i in range(100):
        a.send("b", Note(f"bye {i}"))
    await a.flush(timeout=5)
    assert a.link("b").idle
    await trio.testing.wait_all_tasks_blocked()
    assert len(network.received["b"]) == 100


async def test_flush_gives_up_on_a_link_that_is_down(autojump_clock, network):
    a = network.add("a")
    network.add("b")
    a.send("b", Note("nobody will carry this"))
    started = trio.current_time()
    await a.flush(timeout=5)
    # A link that is down has nothing in flight: flush does not wait for it.
    assert trio.current_time() - started < 0.1


async def test_a_link_down_for_long_keeps_only_the_newest_messages(autojump_clock, network):
    a = network.add("a")
    link = a.link("b")
    for i in range(OUTBOX_LIMIT + 10):
        link.send(Note(f"m{i}"))
    assert link.dropped == 10
    assert not link.idle


class LossyConnection:
    """One end of an in-memory message connection whose frames can be lost on the way, as on a
    connection that breaks, or that the other end replaced, with frames in flight."""

    def __init__(self, send: trio.MemorySendChannel, receive: trio.MemoryReceiveChannel):
        self._send, self._receive = send, receive
        self.losing = False

    async def send_message(self, message: bytes) -> None:
        if not self.losing:
            await self._send.send(message)

    async def get_message(self) -> bytes:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise ConnectionClosed(CloseReason(1000, None)) from None

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        await self._send.aclose()


def lossy_pair() -> tuple[LossyConnection, LossyConnection]:
    there, from_here = trio.open_memory_channel(100)
    back, from_there = trio.open_memory_channel(100)
    return LossyConnection(there, from_there), LossyConnection(back, from_here)


def nodes_a_and_b(deliver=None) -> tuple[Links, Links, list[str]]:
    """Two nodes' links with no dialer (the test hands them their connections), and the texts
    they receive, unless `deliver` takes them."""
    received: list[str] = []

    async def keep(remote_id: str, messages: list[object]) -> None:
        received.extend(m.text for m in messages)

    deliver = deliver or keep
    return (
        Links("a", b"s", CODEC, None, deliver, random.Random(1), generation=1),
        Links("b", b"s", CODEC, None, deliver, random.Random(2), generation=1),
        received,
    )


async def test_what_a_replaced_connection_lost_is_sent_again_once(autojump_clock, nursery):
    a, b, received = nodes_a_and_b()
    first_a, first_b = lossy_pair()
    nursery.start_soon(a.link("b").carry, first_a, 1)
    nursery.start_soon(b.link("a").carry, first_b, 1)
    a.send("b", Note("m1"))
    await trio.sleep(1)
    assert received == ["m1"]
    # The first connection breaks down: b's acknowledgement of m2 is lost, then m3 itself.
    first_b.losing = True
    a.send("b", Note("m2"))
    await trio.sleep(1)
    first_a.losing = True
    a.send("b", Note("m3"))
    await trio.sleep(1)
    assert received == ["m1", "m2"]
    assert a.link("b").unacknowledged == 2
    # A second connection replaces the first on both sides: a sends everything b has not
    # acknowledged again, and b drops what it already had.
    second_a, second_b = lossy_pair()
    nursery.start_soon(a.link("b").carry, second_a, 1)
    nursery.start_soon(b.link("a").carry, second_b, 1)
    await trio.sleep(1)
    assert received == ["m1", "m2", "m3"]
    assert a.link("b").unacknowledged == 0


def socket_pair() -> tuple[WebSocket, WebSocket]:
    """Two ends of a WebSocket over a connected pair of plain sockets."""
    left, right = trio.socket.socketpair()
    return (
        WebSocket(trio.SocketStream(left), FrameReader(1 << 20), client=True),
        WebSocket(trio.SocketStream(right), FrameReader(1 << 20, from_client=True), client=False),
    )


async def test_what_is_sent_together_leaves_from_the_sending_task_one_frame_a_link(nursery):
    received: list[tuple[str, str]] = []
    arrived = trio.Event()

    async def deliver(remote_id: str, messages: list[object]) -> None:
        received.extend((remote_id, m.text) for m in messages)
        if len(received) == 4:
            arrived.set()

    a, b, _ = nodes_a_and_b(deliver)
    c = Links("c", b"s", CODEC, None, deliver, random.Random(3), generation=1)
    for there, back in [(b, "b"), (c, "c")]:
        here_end, there_end = socket_pair()
        nursery.start_soon(a.link(back).carry, here_end, 1)
        nursery.start_soon(there.link("a").carry, there_end, 1)
    with trio.fail_after(10):
        # Each link's first frame tells the other end what arrived (nothing yet).
        while a.link("b").frames_sent + a.link("c").frames_sent < 2:
            await trio.sleep(0.001)
        a.send_together([("b", Note("1")), ("c", Note("2")), ("b", Note("3")), ("c", Note("4"))])
        # Written before this task let any other run: the send loops never woke.
        assert (a.link("b").frames_sent, a.link("c").frames_sent) == (2, 2)
        await arrived.wait()
    assert sorted(received) == [("a", "1"), ("a", "2"), ("a", "3"), ("a", "4")]


async def test_a_link_busy_sending_leaves_what_is_sent_together_to_its_send_loop(nursery):
    a, b, received = nodes_a_and_b()
    here_end, there_end = socket_pair()
    nursery.start_soon(a.link("b").carry, here_end, 1)
    with trio.fail_after(10):
        while a.link("b").frames_sent < 1:
            await trio.sleep(0.001)
        # Nobody reads b's end yet: a frame far larger than the socket's buffers stays in part.
        big = "x" * 600_000
        a.send_together([("b", Note(big))])
        assert a.link("b").frames_sent == 2
        assert here_end.draining
        a.send_together([("b", Note("after"))])
        assert a.link("b").frames_sent == 2  # behind the tail: the send loop's
        nursery.start_soon(b.link("a").carry, there_end, 1)
        while len(received) < 2:
            await trio.sleep(0.001)
    assert received == [big, "after"]
    assert a.link("b").frames_sent == 3 and not here_end.draining


async def test_refused_links_are_logged_a_line_every_ten_seconds_at_most(
    autojump_clock, network, nursery, caplog
):
    network.add("a", secret=b"wrong")
    network.add("b")
    nursery.start_soon(network.nodes["a"].keep_linked, "b", "b")
    with caplog.at_level("WARNING", logger="sluicegate.links"):
        await trio.sleep(60)
    lines = [r.getMessage() for r in caplog.records if "node link(s)" in r.getMessage()]
    refused = len(network.servers)
    assert refused > len(lines)  # the dialler kept trying
    assert 1 <= len(lines) <= 60 / REFUSAL_LOG_INTERVAL + 1
    # The first is logged at once; each line counts those since the line before.
    counts = [int(line.split()[1]) for line in lines]
    assert counts[0] == 1 and sum(counts) <= refused
