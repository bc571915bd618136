"""The client's rules in time, against scripted in-memory nodes under trio's mock clock: when it
leaves a node that stalls, and when a wait is over."""

from __future__ import annotations

import itertools
import math
import random

import msgpack
import pytest
import trio

from sluicegate.client.client import SHORTEST_WAIT, Client
from sluicegate.client.session import LockTimeout

EXPIRES_IN = 6.0
BEAT = EXPIRES_IN / 3


class ScriptedSocket:
    """One connection to a scripted node: each request gets `node.answer(request)`, an answer
    body (`ok`/`error`) after a delay, or None (never answered)."""

    def __init__(self, node: ScriptedNode) -> None:
        self.node = node
        self.closed = None
        self._send, self._receive = trio.open_memory_channel(math.inf)

    async def send_message(self, data: bytes) -> None:
        message = msgpack.unpackb(data)
        if isinstance(message, dict):  # the hello
            self._send.send_nowait(msgpack.packb({"welcome": 1, "node": self.node.name}))
            return
        for request in message:
            self.node.requests.append((trio.current_time(), request))
            scripted = self.node.answer(request)
            if scripted is not None:
                delay, body = scripted
                self.node.nursery.start_soon(self._answer, delay, {"id": request["id"], **body})

    async def _answer(self, delay: float, answer: dict) -> None:
        await trio.sleep(delay)
        if self.closed is None:
            self._send.send_nowait(msgpack.packb([answer]))

    async def get_message(self) -> bytes:
        return await self._receive.receive()

    async def aclose(self) -> None:
        self.closed = "closed"


class ScriptedNode:
    def __init__(self, name: str, nursery: trio.Nursery) -> None:
        self.name = name
        self.nursery = nursery
        self.requests: list[tuple[float, dict]] = []
        self.stalled = False
        self._peers = itertools.count(1)

    def answer(self, request: dict) -> tuple[float, dict] | None:
        op = request["op"]
        if self.stalled and op == "heartbeat":
            return None
        if op == "new_peer":
            return 0.001, {"ok": next(self._peers)}
        if op == "acquire":
            return 0.001, {"ok": {"acquired": True, "token": 1}}
        return 0.001, {"ok": None}

    def sent(self, op: str) -> list[float]:
        return [at for at, request in self.requests if request["op"] == op]


def client_of(nodes: dict[str, ScriptedNode]) -> Client:
    async def open_websocket(url: str) -> ScriptedSocket:
        return ScriptedSocket(nodes[url.split("//")[1].split("/")[0]])

    return Client(
        [f"ws://{name}/ws" for name in nodes],
        expires_in=EXPIRES_IN,
        rng=random.Random(1),
        open_websocket=open_websocket,
    )


async def test_a_node_that_stalls_a_heartbeat_is_left_within_two_thirds_of_a_beat(
    autojump_clock, nursery
):
    """A beat unanswered for half a beat makes the client beat again on the next node, looked
    for eight times a beat: a lease whose home (or the way to it) stalls is kept elsewhere."""
    nodes = {name: ScriptedNode(name, nursery) for name in ("n1", "n2")}
    async with client_of(nodes) as client:
        async with client.lock("A") as lease:
            await trio.sleep(BEAT / 4)  # stalls a little after a beat went
            nodes["n1"].stalled = True
            await trio.sleep(3 * EXPIRES_IN)
            assert not lease.lost
        assert client.node == "n2"
    stalled_from = nodes["n1"].sent("heartbeat")[-1]
    moved_at = nodes["n2"].sent("heartbeat")[0]
    assert BEAT / 2 <= moved_at - stalled_from <= 2 * BEAT / 3


async def test_a_wait_answered_early_by_a_fast_clock_ends_at_its_timeout(autojump_clock, nursery):
    """A node whose clock runs 1% fast answers each wait a hundredth early: the client asks
    again for what is left only while that is worth a wait."""
    node = ScriptedNode("n1", nursery)

    def early(request: dict) -> tuple[float, dict] | None:
        if request["op"] == "acquire":
            if len(node.sent("acquire")) > 100:  # never ending: refuse, for the test to fail
                return 0.0, {"error": "bad_request", "message": "enough"}
            return request.get("wait", 0.0) * 0.99, {"ok": {"acquired": False}}
        return ScriptedNode.answer(node, request)

    node.answer = early
    async with client_of({"n1": node}) as client:
        with pytest.raises(LockTimeout):
            async with client.lock("A", timeout=0.1):
                pass
    waits = [request["wait"] for _, request in node.requests if request["op"] == "acquire"]
    assert len(waits) < 10 and min(waits) >= SHORTEST_WAIT
