"""Calls between nodes over in-memory links under the virtual clock.

pytest-trio only runs a test under a clock that the test itself asks for, hence `autojump_clock` in
every signature.
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing
from trio_websocket import wrap_client_stream, wrap_server_stream

from sluicegate.cluster.errors import LockNeverAcquirable, NotServingCutOff, UnknownPeer
from sluicegate.cluster.rate_algorithms import Decision
from sluicegate.cluster.rate_limits import RateChecks, RateHandover, RateState, SlotRates
from sluicegate.cluster.semaphore_ops import (
    LAST_PEER_ID,
    Acquire,
    AcquireOutcome,
    IsAcquired,
    ListPeers,
    Remainder,
)
from sluicegate.cluster.slots import Ballot
from sluicegate.node.link_codec import LINK_CODEC
from sluicegate.node.links import STALL_AFTER, Links
from sluicegate.node.rpc import Call, Failure, Reply, Rpc, Unavailable, Unreachable


class Pair:
    """Node "a" calls node "b", whose handler is replaceable per test."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.handler = None
        self.rpcs: dict[str, Rpc] = {}
        self.nodes: dict[str, Links] = {}
        self.streams: list[trio.testing.MemorySendStream] = []
        # Set to hold what arrives at each node, as a clogged link or a frozen node would.
        self.holding: trio.Event | None = None
        # When each node had had news of the other's life twice, as gossip would tell it.
        self.news_twice_at: dict[str, float] = {}
        for name in ("a", "b"):
            self.nodes[name] = Links(
                name,
                b"k",
                LINK_CODEC,
                self._dial,
                self._deliver(name),
                random.Random(name),
                1,
                on_link_down=lambda remote_id, name=name: self.rpcs[name].link_down(remote_id),
            )
            self.rpcs[name] = Rpc(self.nodes[name], news_twice_at=self.news_twice_at.get)

    def _deliver(self, name: str):
        async def deliver(remote_id: str, messages: list[object]) -> None:
            if self.holding is not None:
                await self.holding.wait()
            for message in messages:
                if isinstance(message, Call):
                    self.nursery.start_soon(self.rpcs[name].serve, remote_id, message, self.handler)
                else:
                    self.rpcs[name].answered(message)

        return deliver

    async def _dial(self, connection_nursery: trio.Nursery, address: str):
        client_stream, server_stream = trio.testing.memory_stream_pair()
        self.streams.append(server_stream)
        self.nursery.start_soon(self._serve, address, server_stream)
        return await wrap_client_stream(connection_nursery, client_stream, address, "/cluster")

    async def _serve(self, address: str, stream) -> None:
        async with trio.open_nursery() as nursery:
            conn = await (await wrap_server_stream(nursery, stream)).accept()
            await self.nodes[address].accept(conn)
            nursery.cancel_scope.cancel()


@pytest.fixture
async def pair(nursery):
    with trio.fail_after(600):
        pair = Pair(nursery)
        nursery.start_soon(pair.nodes["a"].keep_linked, "b", "b")
        await trio.sleep(1)
        yield pair


async def test_a_call_returns_the_remote_result(autojump_clock, pair):
    async def handler(op):
        return {Remainder: 7, ListPeers: [19, 0]}.get(type(op), AcquireOutcome(True, 42))

    pair.handler = handler
    rpc = pair.rpcs["a"]
    assert await rpc.call("b", Remainder("A"), timeout=5) == 7
    # A peer list that looks like a tagged message still comes back as a list.
    assert await rpc.call("b", ListPeers(), timeout=5) == [19, 0]
    assert await rpc.call("b", ListPeers(2**63, LAST_PEER_ID, 3), timeout=5) == [19, 0]
    assert await rpc.call("b", Acquire(1, "A", 1), timeout=5) == AcquireOutcome(True, 42)


async def test_domain_errors_arrive_as_the_same_exceptions(autojump_clock, pair):
    async def handler(op):
        if isinstance(op, Acquire):
            raise LockNeverAcquirable(5, 1)
        raise UnknownPeer(op.peer_id)

    pair.handler = handler
    with pytest.raises(LockNeverAcquirable) as error:
        await pair.rpcs["a"].call("b", Acquire(1, "A", 5), timeout=5)
    assert (error.value.asked, error.value.max) == (5, 1)
    with pytest.raises(UnknownPeer):
        await pair.rpcs["a"].call("b", IsAcquired(2**64 - 1), timeout=5)
    # Refused by a node cut off from most: the forwarder tells its client to move on.
    pair.handler = lambda op: _raise(NotServingCutOff("peer 3 is not served by b now"))
    with pytest.raises(NotServingCutOff, match="peer 3"):
        await pair.rpcs["a"].call("b", IsAcquired(3), timeout=5)


async def _raise(error: Exception) -> None:
    raise error


async def test_no_link_or_no_answer_is_unavailable(autojump_clock, pair):
    async def slow(op):
        await trio.sleep(100)

    pair.handler = slow
    with pytest.raises(Unavailable):
        await pair.rpcs["a"].call("nobody", Remainder("A"), timeout=5)
    started = trio.current_time()
    with pytest.raises(Unavailable):
        await pair.rpcs["a"].call("b", Remainder("A"), timeout=5)
    assert trio.current_time() - started == pytest.approx(5)
    await trio.sleep(200)  # the late answer arrives and is dropped without harm


async def test_the_remote_can_refuse_with_unavailable(autojump_clock, pair):
    async def refuse(op):
        raise Unavailable("not the owner")

    pair.handler = refuse
    with pytest.raises(Unavailable, match="not the owner"):
        await pair.rpcs["a"].call("b", Remainder("A"), timeout=5)


def test_rpc_messages_round_trip_through_the_link_codec():
    messages = [
        Call(1, Acquire(2**64 - 1, "ä/b", 3, 1.5, None, 17)),
        Reply(1, AcquireOutcome(True, 2**62)),
        Reply(2, [19, 0]),
        Reply(3, None),
        Reply(4, True),
        Failure(5, "LockHierarchyViolation", [0, 1]),
        Call(6, RateChecks("api", "u1", 2, 3)),
        Reply(6, [Decision(True, 4, 0.0), Decision(False, 0, 0.25)]),
        Reply(7, Decision(True, 1, 0.0)),
        Failure(8, "StaleOperation", [3, 4]),
        RateHandover(
            12,
            Ballot(1_700_000_000_000, 3, "n1"),
            SlotRates((RateState("api", "u1", (3.5, 0.25)),), spent_for=10.5),
        ),
    ]
    assert LINK_CODEC.decode(LINK_CODEC.encode(messages)) == messages


async def test_a_broken_link_fails_the_calls_waiting_on_it_at_once(autojump_clock, pair, nursery):
    async def slow(op):
        await trio.sleep(100)

    pair.handler = slow

    async def sever_later() -> None:
        await trio.sleep(1)
        await pair.streams[-1].aclose()  # the other node dies mid-call

    nursery.start_soon(sever_later)
    started = trio.current_time()
    with pytest.raises(Unavailable, match="broke"):
        await pair.rpcs["a"].call("b", Remainder("A"), timeout=60)
    assert trio.current_time() - started < 2


async def test_a_call_over_a_link_stalled_to_a_node_others_hear_from_is_unreachable(
    autojump_clock, pair
):
    async def slow(op):
        await trio.sleep(3)
        return 7

    pair.handler = slow
    rpc = pair.rpcs["a"]
    # Taken in time, a call waits for its answer however long the other node works on it.
    started = trio.current_time()
    assert await rpc.call("b", Remainder("A"), timeout=60) == 7
    assert trio.current_time() - started == pytest.approx(3, abs=0.1)

    pair.holding = trio.Event()
    started = trio.current_time()

    async def others_hear_of_b() -> None:
        await trio.sleep(2)
        pair.news_twice_at["b"] = trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(others_hear_of_b)
        # As long as nobody hears from b, it may be frozen: wait (it is counted down soon).
        # Once others do, only this link fails it: give up, so the client asks elsewhere.
        with pytest.raises(Unreachable, match="stalled before it took the call"):
            await rpc.call("b", Remainder("A"), timeout=60)
    assert trio.current_time() - started == pytest.approx(2 + STALL_AFTER, abs=STALL_AFTER)
    # The next call is refused at once.
    started = trio.current_time()
    with pytest.raises(Unreachable, match="is stalled, while others hear from it"):
        await rpc.call("b", Remainder("A"), timeout=60)
    assert trio.current_time() == started

    pair.holding.set()
    pair.holding = None
    await trio.sleep(1)  # the held call arrives, is answered, and its late answer dropped
    assert await rpc.call("b", Remainder("A"), timeout=60) == 7


async def test_a_call_over_a_link_stalled_to_a_silent_node_waits(autojump_clock, pair):
    async def answer(op):
        return 7

    pair.handler = answer
    pair.holding = trio.Event()
    pair.news_twice_at["b"] = trio.current_time()  # news from before the stall: b may be frozen
    started = trio.current_time()
    with pytest.raises(Unavailable, match="did not answer within 5 s") as refused:
        await pair.rpcs["a"].call("b", Remainder("A"), timeout=5)
    assert not isinstance(refused.value, Unreachable)
    assert trio.current_time() - started == pytest.approx(5)
    pair.holding.set()


async def test_a_call_over_a_link_down_is_unreachable_only_if_others_hear_from_the_node(
    autojump_clock, pair
):
    async def answer(op):
        return 7

    pair.handler = answer
    rpc = pair.rpcs["a"]
    with pytest.raises(Unavailable, match="no link to nobody") as refused:
        await rpc.call("nobody", Remainder("A"), timeout=5)
    assert not isinstance(refused.value, Unreachable)
    await pair.streams[-1].aclose()  # the link breaks, and redials after a backoff
    while pair.nodes["a"].find("b").connected:
        await trio.sleep(0.001)
    pair.news_twice_at["b"] = trio.current_time() - 1  # news from before it broke: b may be dead
    with pytest.raises(Unavailable, match="no link to b") as refused:
        await rpc.call("b", Remainder("A"), timeout=5)
    assert not isinstance(refused.value, Unreachable)
    pair.news_twice_at["b"] = trio.current_time() + 0.01  # news since, through others
    await trio.sleep(0.01)
    with pytest.raises(Unreachable, match="the link to b is down, while others hear from it"):
        await rpc.call("b", Remainder("A"), timeout=5)
    await trio.sleep(1)  # redialled
    assert await rpc.call("b", Remainder("A"), timeout=5) == 7
