"""A `/ws` connection over an in-memory WebSocket under trio's virtual clock: the hello deadline,
the idle timeout, and waiting acquires that keep a connection open past it."""

from __future__ import annotations

import os
import random

import msgpack
import pytest
import trio
from trio_websocket import CloseReason, ConnectionClosed

from sluicegate.client.websocket import FrameReader
from sluicegate.cluster.rate_limits import RateLimits
from sluicegate.cluster.semaphores import SemaphoreConfig, SemaphoreCore
from sluicegate.node.latencies import Latencies
from sluicegate.node.rate_limit_service import RateLimitService
from sluicegate.node.semaphore_actor import SemaphoreActor
from sluicegate.node.semaphore_service import LocalSemaphores
from sluicegate.node.websocket import WebSocket
from sluicegate.node.ws_shell import (
    FRAME_STEP,
    HELLO_TIMEOUT,
    IDLE_TIMEOUT,
    FrameTurns,
    WsConnection,
)
from tests.collector import held


class FakeWebSocket:
    """The server's side of a WebSocket; the test plays the client through `to_server` and
    `from_server`."""

    def __init__(self) -> None:
        self.to_server_send, self._incoming = trio.open_memory_channel(100)
        self._outgoing, self.from_server = trio.open_memory_channel(100)
        self.closed: CloseReason | None = None

    async def get_message(self) -> bytes:
        return await self._incoming.receive()

    async def send_message(self, message: bytes) -> None:
        if self.closed is not None:
            raise ConnectionClosed(self.closed)
        await self._outgoing.send(message)

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        self.closed = CloseReason(code, reason)


@pytest.fixture
async def served(nursery):
    actor = SemaphoreActor(SemaphoreCore({"A": SemaphoreConfig(1)}), rng=random.Random(1))
    await nursery.start(actor.run)
    ws = FakeWebSocket()
    connection = WsConnection(
        ws, LocalSemaphores(actor), RateLimitService(RateLimits({})), "n1", Latencies()
    )
    done = trio.Event()

    async def run() -> None:
        await connection.run()
        done.set()

    nursery.start_soon(run)
    yield ws, done
    actor.close()


async def hello(ws) -> None:
    await ws.to_server_send.send(msgpack.packb({"hello": 1}))
    assert msgpack.unpackb(await ws.from_server.receive())["welcome"] == 1


async def test_no_hello_in_time_closes_the_connection(autojump_clock, served):
    ws, done = served
    await done.wait()
    assert trio.current_time() == pytest.approx(HELLO_TIMEOUT)
    assert ws.closed.code == 4000


async def test_an_idle_connection_is_closed_after_the_idle_timeout(autojump_clock, served):
    ws, done = served
    await hello(ws)
    started = trio.current_time()
    await done.wait()
    assert trio.current_time() - started == pytest.approx(IDLE_TIMEOUT)
    assert ws.closed.code == 1001


async def test_a_waiting_acquire_keeps_the_connection_open(autojump_clock, served):
    ws, done = served
    await hello(ws)
    requests = [
        {"id": 1, "op": "new_peer", "expires_in": 1000},
        {"id": 2, "op": "new_peer", "expires_in": 1000},
    ]
    await ws.to_server_send.send(msgpack.packb(requests))
    answers = msgpack.unpackb(await ws.from_server.receive())
    holder, waiter = (answer["ok"] for answer in answers)
    await ws.to_server_send.send(
        msgpack.packb(
            [
                {"id": 3, "op": "acquire", "peer": holder, "semaphore": "A"},
                {"id": 4, "op": "acquire", "peer": waiter, "semaphore": "A", "wait": 100},
            ]
        )
    )
    assert msgpack.unpackb(await ws.from_server.receive())[0]["id"] == 3
    started = trio.current_time()
    # Silent for longer than the idle timeout, but an acquire waits: still open.
    with trio.fail_after(200):
        [late] = msgpack.unpackb(await ws.from_server.receive())
    assert late == {"id": 4, "ok": {"acquired": False}}
    assert trio.current_time() - started == pytest.approx(100)
    assert not done.is_set()


async def test_a_big_frame_is_handled_a_step_at_a_time(autojump_clock, nursery):
    """A frame of 1,000 new peers reaches the node's actor in steps of at most `FRAME_STEP`,
    with other tasks let in between: in one step it held the whole node up."""
    actor = SemaphoreActor(SemaphoreCore({"A": SemaphoreConfig(1)}), rng=random.Random(1))
    await nursery.start(actor.run)
    steps: list[int] = []

    class Recorded(LocalSemaphores):
        def submit(self, requests, owner=None):
            steps.append(len(requests))
            super().submit(requests, owner)

    ws = FakeWebSocket()
    connection = WsConnection(
        ws, Recorded(actor), RateLimitService(RateLimits({})), "n1", Latencies()
    )
    nursery.start_soon(connection.run)
    await hello(ws)
    frame = [{"id": i, "op": "new_peer", "expires_in": 60} for i in range(1000)]
    await ws.to_server_send.send(msgpack.packb(frame))
    answers: list[dict] = []
    while len(answers) < 1000:
        answers.extend(msgpack.unpackb(await ws.from_server.receive()))
    assert all("ok" in answer for answer in answers)
    assert sum(steps) == 1000 and max(steps) <= FRAME_STEP and len(steps) > 1
    actor.close()


class Batches(trio.abc.Instrument):
    """Counts trio's batches: between two, the loop looks at its sockets."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


@pytest.mark.parametrize("shared", [True, False], ids=["one node's turns", "turns of their own"])
async def test_connections_take_turns_to_apply_steps_of_their_frames(
    autojump_clock, nursery, shared
):
    """Two connections each send a frame of three steps at once. With the node's `FrameTurns`,
    no two steps run between two looks at the sockets (each step of one may hold the others up
    only by itself); with turns of their own, both connections' steps run back to back."""
    actor = SemaphoreActor(SemaphoreCore({"A": SemaphoreConfig(1)}), rng=random.Random(1))
    await nursery.start(actor.run)
    batches = Batches()
    steps: list[tuple[int, object]] = []

    class Recorded(LocalSemaphores):
        def submit(self, requests, owner=None):
            steps.append((batches.count, owner))
            super().submit(requests, owner)

    turns = FrameTurns()
    sockets = [FakeWebSocket() for _ in range(2)]
    for ws in sockets:
        connection = WsConnection(
            ws,
            Recorded(actor),
            RateLimitService(RateLimits({})),
            "n1",
            Latencies(),
            peers_per_connection=10 * FRAME_STEP,
            turns=turns if shared else None,
        )
        nursery.start_soon(connection.run)
        await hello(ws)
    frame = msgpack.packb(
        [{"id": i, "op": "new_peer", "expires_in": 60} for i in range(3 * FRAME_STEP)]
    )
    trio.lowlevel.add_instrument(batches)
    try:
        for ws in sockets:
            ws.to_server_send.send_nowait(frame)
        for ws in sockets:
            answers: list[dict] = []
            while len(answers) < 3 * FRAME_STEP:
                answers.extend(msgpack.unpackb(await ws.from_server.receive()))
            assert all("ok" in answer for answer in answers)
    finally:
        trio.lowlevel.remove_instrument(batches)
    assert len(steps) >= 6
    owners_per_batch = {}
    for batch, owner in steps:
        owners_per_batch.setdefault(batch, set()).add(owner)
    most_in_a_batch = max(len(owners) for owners in owners_per_batch.values())
    assert most_in_a_batch == (1 if shared else 2)
    actor.close()


async def test_waiting_acquires_leave_the_garbage_collector_little_to_walk(autojump_clock, nursery):
    """2,000 acquires waiting on a connection: what the node keeps of each (the connection's
    request, the actor's asker, the parked acquire) is plain values. As objects they were four
    per acquire, which every full collection walked: 44 ms with 20,000 waiting. What is left is
    a reference from the heap of their deadlines. Counted from the actor and the connection (335
    objects), not over the whole process: the background simulation runs' threads allocate
    meanwhile."""
    actor = SemaphoreActor(SemaphoreCore({"A": SemaphoreConfig(1)}), rng=random.Random(1))
    await nursery.start(actor.run)
    ws = FakeWebSocket()
    connection = WsConnection(
        ws,
        LocalSemaphores(actor),
        RateLimitService(RateLimits({})),
        "n1",
        Latencies(),
        peers_per_connection=3000,
    )
    nursery.start_soon(connection.run)
    await hello(ws)

    async def answers_to(frame: list[dict]) -> list[dict]:
        await ws.to_server_send.send(msgpack.packb(frame))
        answers: list[dict] = []
        while len(answers) < len(frame):
            answers.extend(msgpack.unpackb(await ws.from_server.receive()))
        return answers

    made = await answers_to([{"id": i, "op": "new_peer", "expires_in": 600} for i in range(2001)])
    holder, *waiters = (answer["ok"] for answer in made)
    await answers_to([{"id": 0, "op": "acquire", "peer": holder, "semaphore": "A"}])
    objects, references = held((actor, connection))
    frame = [
        {"id": i, "op": "acquire", "peer": peer, "semaphore": "A", "wait": 600}
        for i, peer in enumerate(waiters)
    ]
    # Answered once every acquire before it in the frame was applied.
    frame.append({"id": -1, "op": "heartbeat", "peer": holder, "expires_in": 600})
    await ws.to_server_send.send(msgpack.packb(frame))
    while not any(a["id"] == -1 for a in msgpack.unpackb(await ws.from_server.receive())):
        pass
    del frame
    more_objects, more_references = held((actor, connection))
    assert more_objects - objects < 100
    assert more_references - references < 2 * len(waiters)
    actor.close()


class LaterSemaphores:
    """Semaphores that answer nothing at once: the test answers, as a cluster's owner would."""

    def __init__(self) -> None:
        self.submitted: list[tuple[object, int]] = []
        self.answers = None

    def serves_here(self, op) -> bool:
        return True

    def submit(self, requests, answers) -> None:
        self.submitted.extend(requests)
        self.answers = answers

    def withdraw(self, answers) -> None:
        pass


async def test_answers_that_come_at_once_leave_in_one_frame_from_the_task_that_gives_them(
    nursery,
):
    client_socket, server_socket = trio.socket.socketpair()
    client = WebSocket(trio.SocketStream(client_socket), FrameReader(1 << 20), client=True)
    server = WebSocket(
        trio.SocketStream(server_socket), FrameReader(1 << 20, from_client=True), client=False
    )
    semaphores = LaterSemaphores()
    connection = WsConnection(
        server, semaphores, RateLimitService(RateLimits({})), "n1", Latencies()
    )
    nursery.start_soon(connection.run)
    with trio.fail_after(10):
        await client.send_message(msgpack.packb({"hello": 1}))
        assert msgpack.unpackb(await client.get_message())["welcome"] == 1
        requests = [{"id": i, "op": "new_peer", "expires_in": 1000} for i in (1, 2)]
        await client.send_message(msgpack.packb(requests))
        while len(semaphores.submitted) < 2:
            await trio.sleep(0.001)
    outcomes = [
        (key, peer_id, None) for (_, key), peer_id in zip(semaphores.submitted, (7, 8), strict=True)
    ]
    semaphores.answers.answered_together(outcomes)
    # On the socket before this task let another run: `_send_answers` never woke.
    reader = FrameReader(1 << 20)
    reader.feed(os.read(client_socket.fileno(), 65536))
    assert msgpack.unpackb(reader.next_event().data) == [{"id": 1, "ok": 7}, {"id": 2, "ok": 8}]
    assert reader.next_event() is None
