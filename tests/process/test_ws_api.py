"""The `/ws` protocol against a real node process: hello, batches, pipelining, waiting acquires
answered at the grant, fencing tokens, and bad input that gets an error or a close code while
other connections carry on."""

from __future__ import annotations

import msgpack
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

pytestmark = pytest.mark.process

TIMEOUT = 10


def ws_url(node) -> str:
    return f"ws://127.0.0.1:{node.port}/ws"


async def hello(ws) -> dict:
    await ws.send_message(msgpack.packb({"hello": 1}))
    return msgpack.unpackb(await ws.get_message())


async def ask(ws, *requests: dict) -> dict[int, dict]:
    """Send the requests in one frame; their answers by id (however many frames they take)."""
    await ws.send_message(msgpack.packb(list(requests)))
    return await answers_to(ws, {request["id"] for request in requests})


async def answers_to(ws, ids: set[int]) -> dict[int, dict]:
    """Read frames until every id in `ids` is answered."""
    answers: dict[int, dict] = {}
    while not ids <= set(answers):
        for answer in msgpack.unpackb(await ws.get_message(), strict_map_key=False):
            answers[answer["id"]] = answer
    return answers


async def one(ws, **request) -> dict:
    return (await ask(ws, {"id": 1, **request}))[1]


async def test_hello_then_a_batch_of_operations(node):
    with trio.fail_after(TIMEOUT):
        async with open_websocket_url(ws_url(node)) as ws:
            welcome = await hello(ws)
            assert welcome["welcome"] == 1 and welcome["max_frame"] == 1024 * 1024
            peer = (await one(ws, op="new_peer", expires_in=60))["ok"]
            answers = await ask(
                ws,
                {"id": 1, "op": "acquire", "peer": peer, "semaphore": "C", "count": 3},
                {"id": 2, "op": "remainder", "semaphore": "C"},
                {"id": 3, "op": "is_acquired", "peer": peer},
                {"id": 4, "op": "heartbeat", "peer": peer, "expires_in": 30},
                {"id": 5, "op": "acquire", "peer": peer, "semaphore": "nope"},
            )
            assert answers[1]["ok"]["acquired"] is True
            assert isinstance(answers[1]["ok"]["token"], int)
            assert answers[2] == {"id": 2, "ok": 2}
            assert answers[3] == {"id": 3, "ok": True}
            assert answers[4] == {"id": 4, "ok": None}
            assert answers[5]["error"] == "unknown_semaphore"
            assert (await one(ws, op="release", peer=peer, semaphore="C"))["ok"] is None
            assert (await one(ws, op="remainder", semaphore="C"))["ok"] == 5


async def test_a_waiting_acquire_is_answered_at_the_grant_and_others_pass_it(node):
    with trio.fail_after(TIMEOUT):
        async with open_websocket_url(ws_url(node)) as ws:
            await hello(ws)
            answers = await ask(
                ws,
                {"id": 1, "op": "new_peer", "expires_in": 60},
                {"id": 2, "op": "new_peer", "expires_in": 60},
            )
            holder, waiter = answers[1]["ok"], answers[2]["ok"]
            held = await one(ws, op="acquire", peer=holder, semaphore="A")
            await ws.send_message(
                msgpack.packb(
                    [{"id": 10, "op": "acquire", "peer": waiter, "semaphore": "A", "wait": 5}]
                )
            )
            # Requests behind the waiting one are answered meanwhile.
            assert (await one(ws, op="remainder", semaphore="A"))["ok"] == 0
            started = trio.current_time()
            await ws.send_message(
                msgpack.packb([{"id": 11, "op": "release", "peer": holder, "semaphore": "A"}])
            )
            granted = (await answers_to(ws, {10, 11}))[10]
            assert granted["ok"]["acquired"] is True
            assert granted["ok"]["token"] > held["ok"]["token"]
            assert trio.current_time() - started < 1


async def test_errors_are_codes_and_the_connection_goes_on(node):
    with trio.fail_after(TIMEOUT):
        async with open_websocket_url(ws_url(node)) as ws:
            await hello(ws)
            answers = await ask(
                ws,
                {"id": 1, "op": "fly"},
                {"id": 2, "op": "acquire", "semaphore": "A"},
                {"id": 3, "op": "acquire", "peer": "x", "semaphore": "A"},
                {"id": 4, "op": "acquire", "peer": 1, "semaphore": "A"},
                {"id": 5, "op": "new_peer", "expires_in": -1},
                {"id": 6, "op": "acquire", "peer": -1, "semaphore": "A"},
            )
            assert answers[1]["error"] == "unknown_op"
            assert answers[2]["error"] == "bad_request" and "peer" in answers[2]["message"]
            assert answers[3]["error"] == "bad_request"
            assert answers[4]["error"] == "unknown_peer"
            assert answers[5]["error"] == "bad_request"
            assert answers[6]["error"] == "bad_request"
            await ws.send_message(msgpack.packb([{"op": "new_peer"}]))
            [no_id] = msgpack.unpackb(await ws.get_message())
            assert no_id["id"] is None and no_id["error"] == "bad_request"
            assert (await one(ws, op="remainder", semaphore="A"))["ok"] == 1


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([b"\xc1"], 1007),
        ([msgpack.packb([{"id": 1, "op": "new_peer", "expires_in": 1}])], 4000),  # no hello
        ([msgpack.packb({"hello": 2})], 4001),
        ([msgpack.packb({"hello": 1}), b"\xc1"], 1007),
        ([msgpack.packb({"hello": 1}), msgpack.packb({"op": "new_peer"})], 1007),
        ([msgpack.packb({"hello": 1}), "text"], 1003),
        ([msgpack.packb({"hello": 1}), b"\x00" * (1024 * 1024 + 1)], 1009),
    ],
)
async def test_broken_connections_are_closed_with_a_code_and_others_are_unharmed(
    node, frames, code
):
    with trio.fail_after(TIMEOUT):
        async with open_websocket_url(ws_url(node)) as bystander:
            await hello(bystander)
            async with open_websocket_url(ws_url(node), max_message_size=4 * 1024 * 1024) as ws:
                # (A frame announced over the bound is refused from its header, while it is
                # still being sent.)
                with pytest.raises(ConnectionClosed) as closed:
                    for frame in frames:
                        await ws.send_message(frame)
                    while True:
                        await ws.get_message()
                assert closed.value.reason.code == code
            assert (await one(bystander, op="remainder", semaphore="C"))["ok"] == 5


async def test_a_flood_of_requests_from_one_connection_is_served_in_full(node):
    with trio.fail_after(30):
        async with open_websocket_url(ws_url(node)) as ws:
            await hello(ws)
            requests = [{"id": i, "op": "remainder", "semaphore": "C"} for i in range(5000)]
            for start in range(0, len(requests), 1000):
                await ws.send_message(msgpack.packb(requests[start : start + 1000]))
            answers = 0
            while answers < len(requests):
                answers += len(msgpack.unpackb(await ws.get_message()))
            assert answers == len(requests)
