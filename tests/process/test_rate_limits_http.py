"""Rate limits on one real node: HTTP, the `/ws` ops, and the client (async and blocking)."""

from __future__ import annotations

import http.client
import json
import threading
import time

import anyio
import msgpack
import pytest
import trio
from trio_websocket import open_websocket_url

from sluicegate import client as sg
from tests.nodes import NodeProcess

pytestmark = pytest.mark.process


TIMEOUT = 20

CONFIG = """
[rate_limits]
api = { algorithm = "token_bucket", capacity = 3, rate = 0.001 }
slow = { algorithm = "gcra", burst = 1, rate = 10 }
crawl = { algorithm = "sliding_log", limit = 2, window = "300ms" }
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(CONFIG, workdir=tmp_path_factory.mktemp("node")) as process:
        yield process


def post(node, path: str, headers: dict | None = None) -> tuple[int, dict, object]:
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=TIMEOUT)
    try:
        conn.request("POST", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        conn.close()


def test_http_answers_go_with_200_and_sorry_with_429_and_retry_after(node):
    for remaining in (2, 1, 0):
        status, _, body = post(node, "/rate_limits/api/check?key=http-a")
        assert (status, body) == (200, {"go": True, "remaining": remaining, "retry_after": 0.0})
    status, headers, body = post(node, "/rate_limits/api/check?key=http-a")
    assert status == 429 and body["go"] is False and body["remaining"] == 0
    # 1 token at 0.001 per second: 1000 s, as whole seconds rounded up in the header.
    assert body["retry_after"] == pytest.approx(1000, rel=0.01)
    assert int(headers["retry-after"]) >= body["retry_after"]
    status, _, body = post(node, "/rate_limits/api/check?key=http-b&n=3")  # another key
    assert status == 200 and body["remaining"] == 0


def test_http_a_check_sent_again_with_its_idempotency_key_takes_effect_once(node):
    path = "/rate_limits/api/check?key=http-retried&n=2"
    first = post(node, path, {"Idempotency-Key": '"a7c1"'})
    assert first[0] == 200 and first[2]["remaining"] == 1
    assert post(node, path, {"Idempotency-Key": '"a7c1"'})[2] == first[2]  # not admitted again
    assert post(node, path, {"Idempotency-Key": '"b9d2"'})[0] == 429  # another request


def test_http_errors_are_json_with_a_code(node):
    status, _, body = post(node, "/rate_limits/nope/check")
    assert (status, body["error"]) == (404, "unknown_limiter")
    for bad in ("n=0", "n=4", "n=abc", "n=-1"):
        status, _, body = post(node, f"/rate_limits/api/check?key=e&{bad}")
        assert (status, body["error"]) == (400, "invalid_weight"), bad


async def test_ws_check_and_wait(node):
    with trio.fail_after(TIMEOUT):
        async with open_websocket_url(f"ws://127.0.0.1:{node.port}/ws") as ws:
            await ws.send_message(msgpack.packb({"hello": 1}))
            await ws.get_message()
            await ws.send_message(
                msgpack.packb(
                    [
                        {"id": 1, "op": "check", "limiter": "slow", "key": "ws"},
                        {"id": 2, "op": "check", "limiter": "slow", "key": "ws"},
                        {"id": 3, "op": "wait", "limiter": "slow", "key": "ws", "timeout": 5},
                        {"id": 4, "op": "check", "limiter": "nope"},
                        {"id": 5, "op": "check", "limiter": "slow", "n": 2},
                        {"id": 6, "op": "check"},
                    ]
                )
            )
            answers = {}
            while len(answers) < 6:
                for answer in msgpack.unpackb(await ws.get_message()):
                    answers[answer["id"]] = answer
    assert answers[1]["ok"]["go"] is True
    assert answers[2]["ok"]["go"] is False and 0 < answers[2]["ok"]["retry_after"] <= 0.1
    assert answers[3]["ok"]["go"] is True  # waited its turn, about 0.1 s
    assert answers[4]["error"] == "unknown_limiter"
    assert answers[5]["error"] == "invalid_weight"
    assert answers[6]["error"] == "bad_request"


async def test_ws_check_asked_times_times_answers_each_in_order(node):
    with trio.fail_after(TIMEOUT):
        async with open_websocket_url(f"ws://127.0.0.1:{node.port}/ws") as ws:
            await ws.send_message(msgpack.packb({"hello": 1}))
            assert msgpack.unpackb(await ws.get_message())["check_times"] is True
            request = {"id": 1, "op": "check", "limiter": "api", "key": "times", "times": 5}
            await ws.send_message(msgpack.packb([request, {**request, "id": 2, "times": 2}]))
            answers = msgpack.unpackb(await ws.get_message())
    assert [a["id"] for a in answers] == [1, 2]
    assert [(d["go"], d["remaining"]) for d in answers[0]["ok"]] == [
        (True, 2),
        (True, 1),
        (True, 0),
        (False, 0),
        (False, 0),
    ]
    assert [d["go"] for d in answers[1]["ok"]] == [False, False]


async def test_ws_a_retried_check_gets_the_go_its_first_try_got(node):
    with trio.fail_after(TIMEOUT):
        async with open_websocket_url(f"ws://127.0.0.1:{node.port}/ws") as ws:
            await ws.send_message(msgpack.packb({"hello": 1}))
            await ws.get_message()
            check = {"op": "check", "limiter": "api", "key": "retried"}
            await ws.send_message(
                msgpack.packb(
                    [
                        {**check, "id": 1, "retry_id": 11},
                        {**check, "id": 2, "retry_id": 11},  # the same request, again
                        {**check, "id": 3, "times": 3, "retry_ids": [12, 11, 13]},
                    ]
                )
            )
            answers = msgpack.unpackb(await ws.get_message())
    first = answers[0]["ok"]
    assert first["go"] and first["remaining"] == 2 and answers[1]["ok"] == first
    assert [(d["go"], d["remaining"]) for d in answers[2]["ok"]] == [
        (True, 1),
        (True, 2),  # 11 again: its first answer
        (True, 0),
    ]


@pytest.mark.anyio
async def test_equal_checks_of_many_tasks_go_as_one_request_each_answered(node, anyio_backend):
    sent: list[list[dict]] = []
    decisions = []
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url) as client:
            await client.check("api", key="warm-up")
            ws = client._connection._ws
            send_message = ws.send_message

            async def spy(message: bytes) -> None:
                sent.append(msgpack.unpackb(message))
                await send_message(message)

            ws.send_message = spy

            async def caller(key: str) -> None:
                decisions.append((key, await client.check("api", key=key)))

            async with anyio.create_task_group() as nursery:
                for i in range(40):
                    nursery.start_soon(caller, anyio_backend + ("many" if i % 8 else "other"))
    requests = [request for frame in sent for request in frame]
    assert len(requests) < 40  # runs of equal checks went as one
    assert sum(request.get("times", 1) for request in requests) == 40
    # Each call has a retry id of its own, sent with its run's.
    retry_ids = [i for r in requests for i in r.get("retry_ids", [r.get("retry_id")])]
    assert len(set(retry_ids)) == 40 and None not in retry_ids
    for key in (anyio_backend + "many", anyio_backend + "other"):
        went = sorted(d.remaining for k, d in decisions if k == key and d.go)
        assert went == [0, 1, 2]  # capacity 3: exactly three, each with its own answer


@pytest.mark.anyio
async def test_the_client_checks_waits_and_decorates(node, anyio_backend):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url) as client:
            assert (await client.check("crawl", key=anyio_backend + "c1")).go
            assert (await client.check("crawl", key=anyio_backend + "c1")).go
            sorry = await client.check("crawl", key=anyio_backend + "c1")
            assert not sorry.go and 0 < sorry.retry_after <= 0.3

            admitted = []

            @client.rate_limited("crawl", key=anyio_backend + "c2")
            async def fetch(url: str) -> str:
                admitted.append(anyio.current_time())
                return url.upper()

            started = anyio.current_time()
            assert [await fetch(f"u{i}") for i in range(5)] == [f"U{i}" for i in range(5)]
            # Two per 300 ms, and any three span more than 300 ms (at the node; seen here, each
            # admission a little later, by as much as its answer took to come: a few ms).
            assert admitted[-1] - started > 0.6
            for first, third in zip(admitted, admitted[2:], strict=False):
                assert third - first > 0.3 - 0.02

            with pytest.raises(sg.RateLimited):
                async with client.rate_limited("api", key=anyio_backend + "c3", n=3):
                    pass
                async with client.rate_limited("api", key=anyio_backend + "c3", timeout=0.2):
                    pass
            with pytest.raises(sg.UnknownLimiter):
                await client.check("nope")


def test_the_blocking_client_from_threads(node):
    admitted = []
    with sg.BlockingClient(node.url) as client:

        @client.rate_limited("slow", key="threads")
        def work(i: int) -> None:
            admitted.append(time.monotonic())

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        assert client.check("slow", key="other").go
    assert len(admitted) == 6
    # GCRA at 10 per second with a burst of 1: six take at least half a second.
    assert max(admitted) - started >= 0.45
