"""A careless or hostile client against a real node process: every attack is bounded, and a
well-behaved client (the bystander) still acquires and releases while it goes on.

Loopback only; every attack is bounded in count and time and stops by itself.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
from contextlib import AsyncExitStack

import msgpack
import pytest
import trio

from tests.nodes import NodeProcess, gauge, hello_and_peers, is_ready, stalls_of, wait_until

pytestmark = pytest.mark.process

CONFIG = "[semaphores]\nA = 1000\nB = 1\n"


def request(node, method: str, path: str, body: bytes | None = None, timeout: float = 5.0):
    """One request on a fresh connection: (status, body)."""
    connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def bystander(node, timeout: float = 5.0) -> float:
    """A well-behaved client's new peer, acquire, release and goodbye; the seconds they took.
    Fails unless each is answered as Throttle answers it, within `timeout`."""
    started = time.monotonic()
    status, body = request(node, "POST", "/new_peer", b'{"expires_in":"1m"}', timeout)
    assert status == 200, body
    peer = json.loads(body)
    assert request(node, "PUT", f"/peers/{peer}/A", b"1", timeout) == (200, str(peer).encode())
    assert request(node, "DELETE", f"/peers/{peer}/A", None, timeout)[0] == 200
    assert request(node, "DELETE", f"/peers/{peer}", None, timeout) == (200, b'"Peer released"')
    return time.monotonic() - started


def holder_and_waiter(node, semaphore: str, expires_in: str = "1m") -> tuple[int, int]:
    """Two new peers: one holding `semaphore` (a max of 1), one free to wait for it."""
    body = b'{"expires_in":"%s"}' % expires_in.encode()
    holder = json.loads(request(node, "POST", "/new_peer", body)[1])
    assert request(node, "PUT", f"/peers/{holder}/{semaphore}", b"1")[0] == 200
    return holder, json.loads(request(node, "POST", "/new_peer", body)[1])


def connect(node) -> socket.socket:
    return socket.create_connection(("127.0.0.1", node.port), timeout=5)


def test_idle_half_requests_cost_no_cpu_and_no_one_else_waits(tmp_path):
    with NodeProcess(CONFIG, workdir=tmp_path) as node:
        bystander(node)
        idle = [connect(node) for _ in range(300)]
        try:
            for sock in idle:
                sock.sendall(b"GET /")  # a request line that could still become `GET /ws `
            time.sleep(0.2)
            cpu = node.cpu_seconds()
            time.sleep(1.0)
            # Peeking at them every millisecond took a whole core.
            assert node.cpu_seconds() - cpu < 0.25
            assert bystander(node) < 1.0
        finally:
            for sock in idle:
                sock.close()


def test_past_the_connection_limit_the_node_answers_503_and_frees_the_socket(tmp_path):
    with NodeProcess(CONFIG + "[limits]\nconnections = 40\n", workdir=tmp_path) as node:
        held = [connect(node) for _ in range(40)]
        try:
            time.sleep(0.2)
            refused = connect(node)
            answer = refused.recv(65536)
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
            assert b"holds at most 40 at once ([limits] connections)" in answer
            assert refused.recv(65536) == b""  # closed by the node
            refused.close()
        finally:
            for sock in held:
                sock.close()
        wait_until(lambda: request(node, "GET", "/health")[0] == 200, 2, "served again")
        bystander(node)
        assert node.log().count("[limits] connections") == 1


def test_abandoned_long_polls_free_their_sockets(tmp_path):
    with NodeProcess(CONFIG.replace("1000", "1"), workdir=tmp_path, files=300) as node:
        holder, waiter = holder_and_waiter(node, "A", "5m")
        baseline = node.open_files()
        # More long polls than the node may open files, each abandoned by its client.
        for _ in range(8):
            polls = [connect(node) for _ in range(50)]
            for sock in polls:
                sock.sendall(
                    b"PUT /peers/%d/A?block_for=60s HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 1\r\n\r\n1" % waiter
                )
            time.sleep(0.1)
            for sock in polls:
                sock.close()
        # A bound a busy machine keeps: that they close is the point here, not how fast.
        wait_until(lambda: node.open_files() <= baseline + 5, 20.0, "the polls' sockets closed")
        assert request(node, "DELETE", f"/peers/{holder}/A")[0] == 200
        assert request(node, "GET", f"/peers/{waiter}/is_acquired") == (200, b"true")
        assert "EMFILE" not in node.log() and "Too many open files" not in node.log()


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("PUT", "/peers/1/A", b"1" * 5000),
        ("POST", "/new_peer", b'{"expires_in":' + b"9" * 5000 + b"}"),
        ("PUT", "/peers/" + "1" * 5000 + "/A", b"1"),
        ("GET", "/peers/" + "1" * 5000 + "/is_acquired", None),
        ("POST", "/rate_limits/api/check?n=" + "1" * 5000, None),
        ("PUT", "/peers/1/A", b"1e999999"),
    ],
)
def test_numbers_of_any_length_get_the_documented_error(tmp_path, method, path, body):
    config = CONFIG + '[rate_limits]\napi = { algorithm = "gcra", burst = 10, rate = 5 }\n'
    with NodeProcess(config, workdir=tmp_path) as node:
        status, answer = request(node, method, path, body)
        assert 400 <= status < 500, (status, answer[:200])
        assert b"Traceback" not in answer and "Traceback" not in node.log()
        bystander(node)


def test_msgpack_of_any_shape_closes_the_websocket_with_1007(tmp_path):
    import trio
    from trio_websocket import ConnectionClosed, open_websocket_url

    async def main(url: str) -> int:
        with trio.fail_after(10):
            async with open_websocket_url(url) as ws:
                await ws.send_message(msgpack.packb({"hello": 1}))
                await ws.get_message()
                # A map keyed by an array: valid msgpack, not a Python dict.
                await ws.send_message(b"\x81\x91\x01\x01")
                try:
                    await ws.get_message()
                except ConnectionClosed as closed:
                    return closed.reason.code
        raise AssertionError("not closed")

    with NodeProcess(CONFIG, workdir=tmp_path) as node:
        assert trio.run(main, f"ws://127.0.0.1:{node.port}/ws") == 1007
        assert "Traceback" not in node.log()
        bystander(node)


def test_what_a_client_chose_is_clipped_before_it_is_logged(tmp_path):
    import trio
    from trio_websocket import ConnectionClosed, open_websocket_url

    async def main(url: str) -> None:
        for _ in range(20):
            with trio.fail_after(10):
                async with open_websocket_url(url) as ws:
                    await ws.send_message(msgpack.packb({"hello": "v" * 1_000_000}))
                    try:
                        await ws.get_message()
                    except ConnectionClosed:
                        pass

    with NodeProcess(CONFIG, workdir=tmp_path) as node:
        before = len(node.log())
        trio.run(main, f"ws://127.0.0.1:{node.port}/ws")
        # Twenty lines of at most a few hundred characters, not twenty megabytes.
        assert len(node.log()) - before < 20 * 1000
        bystander(node)


def test_a_websocket_client_that_never_reads_is_held_to_a_bound(tmp_path):
    import trio
    from trio_websocket import open_websocket_url

    # Waits are answered by tasks, not by the read loop: their answers go out through the
    # connection's sender, which blocks once the client stops reading.
    frame = msgpack.packb(
        [{"id": i, "op": "wait", "limiter": "api", "timeout": 1} for i in range(1000)]
    )
    config = (
        CONFIG + '[rate_limits]\napi = { algorithm = "gcra", burst = 1000000000, rate = 1e9 }\n'
    )

    async def never_read(url: str, node) -> int:
        sent = 0
        # trio-websocket queues one message, then stops reading the socket.
        async with open_websocket_url(url, message_queue_size=1) as ws:
            await ws.send_message(msgpack.packb({"hello": 1}))
            with trio.move_on_after(5):
                while True:
                    await ws.send_message(frame)
                    sent += 1
            await trio.to_thread.run_sync(bystander, node)
            with trio.move_on_after(1):
                await ws.aclose()
        return sent

    with NodeProcess(config, workdir=tmp_path) as node:
        before = node.rss_mb()
        sent = trio.run(never_read, f"ws://127.0.0.1:{node.port}/ws", node)
        # The node stopped reading once its answers waited (and sent none of them in a frame
        # above 1 MiB, which the client would have refused): the client's sends blocked.
        assert sent < 500
        assert node.rss_mb() - before < 100
        bystander(node)


async def _ws_session(url: str, frames: list[list[dict]]) -> list[dict]:
    """Send `frames` of requests on one /ws connection; every answer, once all came (waits of
    up to a second included)."""
    import trio
    from trio_websocket import open_websocket_url

    expected = sum(len(frame) for frame in frames)
    answers: list[dict] = []
    with trio.fail_after(30):
        async with open_websocket_url(url, max_message_size=2**21) as ws:
            await ws.send_message(msgpack.packb({"hello": 1}))
            await ws.get_message()
            for frame in frames:
                await ws.send_message(msgpack.packb(frame))
            while len(answers) < expected:
                answers.extend(msgpack.unpackb(await ws.get_message(), strict_map_key=False))
    return answers


def ws_session(node, frames: list[list[dict]]) -> list[dict]:
    import trio

    return trio.run(_ws_session, f"ws://127.0.0.1:{node.port}/ws", frames)


def test_one_websocket_connection_makes_at_most_its_share_of_peers(tmp_path):
    config = CONFIG + "[limits]\npeers_per_connection = 100\npeers = 1000\n"
    with NodeProcess(config, workdir=tmp_path) as node:
        frames = [
            [{"id": i, "op": "new_peer", "expires_in": 60} for i in range(start, start + 50)]
            for start in range(0, 300, 50)
        ]
        answers = ws_session(node, frames)
        made = [a for a in answers if "ok" in a]
        refused = [a for a in answers if a.get("error") == "quota_full"]
        assert len(made) == 100 and len(refused) == 200
        assert refused[0]["message"].endswith("([limits] peers_per_connection)")
        bystander(node)


def test_the_node_holds_at_most_its_peers_and_says_which_limit(tmp_path):
    with NodeProcess(CONFIG + "[limits]\npeers = 20\n", workdir=tmp_path) as node:
        peers = []
        for _ in range(20):
            status, body = request(node, "POST", "/new_peer", b'{"expires_in":"1m"}')
            assert status == 200
            peers.append(json.loads(body))
        status, body = request(node, "POST", "/new_peer", b'{"expires_in":"1m"}')
        assert status == 429
        assert body == b"this node holds 20 peers, the most it may ([limits] peers)"
        assert request(node, "DELETE", f"/peers/{peers[0]}")[0] == 200
        bystander(node)


def test_listing_many_peers_answers_them_all_and_takes_a_limit(tmp_path):
    config = CONFIG + "[limits]\npeers_per_connection = 60000\n"
    with NodeProcess(config, workdir=tmp_path) as node:
        made = set()
        for start in range(0, 60_000, 5000):  # in turns: the node stops reading a connection
            frames = [  # whose answers are not read
                [{"id": i, "op": "new_peer", "expires_in": 600} for i in range(at, at + 1000)]
                for at in range(start, start + 5000, 1000)
            ]
            made |= {a["ok"] for a in ws_session(node, frames)}
        assert len(made) == 60_000
        status, body = request(node, "GET", "/peers/", timeout=30)
        assert status == 200 and {entry["id"] for entry in json.loads(body)} == made
        status, body = request(node, "GET", "/peers/?limit=7")
        assert status == 200 and len(json.loads(body)) == 7
        for bad in (b"x", b"-1", b"9" * 5000):
            status, body = request(node, "GET", "/peers/?limit=" + bad.decode())
            assert status == 400 and body.startswith(b"Failed to deserialize query string: ")
            assert len(body) < 200
        bystander(node)


def test_waiting_acquires_of_closed_connections_are_withdrawn(tmp_path):
    """Connections that park waits and close: the waits go with them, on a cluster node too
    (a cluster of one: its gauge counts them)."""
    config = CONFIG + '[cluster]\ndown_after = "1s"\n'
    env = {"SLUICEGATE_CLUSTER_SECRET": "abuse-test-secret-16+"}
    with NodeProcess(config, workdir=tmp_path, args=["--node-id", "n1"], env=env) as node:
        wait_until(lambda: is_ready(node.url), 15, "the node serves")
        holder_and_waiter(node, "B")
        trio.run(_park_and_leave, f"ws://127.0.0.1:{node.port}/ws", node, 20, 16)
        wait_until(lambda: gauge(node, "sluicegate_acquires_waiting") == 0, 2, "withdrawn")
        bystander(node)


async def _park_and_leave(url: str, node, connections: int, waits: int) -> None:
    """`connections` connections each make a peer, park `waits` waits for B, and close."""
    from trio_websocket import open_websocket_url

    async with AsyncExitStack() as stack:
        for _ in range(connections):
            ws = await stack.enter_async_context(open_websocket_url(url))
            [peer] = await hello_and_peers(ws, 1)
            frame = [
                {"id": i, "op": "acquire", "peer": peer, "semaphore": "B", "wait": 600}
                for i in range(1, waits + 1)
            ]
            await ws.send_message(msgpack.packb(frame))
        parked = connections * waits
        with trio.fail_after(10):
            while gauge(node, "sluicegate_acquires_waiting") < parked:
                await trio.sleep(0.05)
    # (leaving the stack closed every connection)


def test_thousands_of_waiters_on_one_semaphore_hold_nobody_up(tmp_path):
    """4,000 acquires waiting on one semaphore of a cluster node: while they come, a bystander
    on another semaphore is answered, the node's loop never stalls for a second (as it logs
    its stalls), and SIGTERM stops it within a second. (Each change of a semaphore once wrote
    all its waiters: 5,000 of them stalled a node for 12 s.)"""
    import signal

    config = CONFIG + '[cluster]\ndown_after = "1s"\n[limits]\npeers_per_connection = 200\n'
    env = {"SLUICEGATE_CLUSTER_SECRET": "abuse-test-secret-16+"}
    with NodeProcess(config, workdir=tmp_path, args=["--node-id", "n1"], env=env) as node:
        wait_until(lambda: is_ready(node.url), 15, "the node serves")
        holder_and_waiter(node, "B")
        url = f"ws://127.0.0.1:{node.port}/ws"

        async def park_while_a_bystander_works() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_park_many, url, node, 20, 200)
                await trio.sleep(0.2)
                await trio.to_thread.run_sync(bystander, node)

        trio.run(park_while_a_bystander_works)
        started = time.monotonic()
        node.signal(signal.SIGTERM)
        assert node.wait(10) == 0
        assert time.monotonic() - started < 1.0
    assert stalls_of(node)[1] < 1000, stalls_of(node)


async def _park_many(url: str, node, connections: int, peers: int) -> None:
    """`connections` connections each make `peers` peers, then all at once park an acquire of B
    for each, and stay open until every one waits."""
    from trio_websocket import open_websocket_url

    made = trio.Event()
    ready = 0

    async def park() -> None:
        nonlocal ready
        async with open_websocket_url(url) as ws:
            made_peers = await hello_and_peers(ws, peers)
            ready += 1
            if ready == connections:
                made.set()
            await made.wait()
            frame = [
                {"id": i, "op": "acquire", "peer": peer, "semaphore": "B", "wait": 600}
                for i, peer in enumerate(made_peers)
            ]
            await ws.send_message(msgpack.packb(frame))
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(park)
        with trio.fail_after(30):
            await made.wait()
            while (gauge(node, "sluicegate_acquires_waiting") or 0) < connections * peers:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()


def test_the_next_peer_id_cannot_be_predicted_from_those_seen(tmp_path):
    """A Mersenne Twister's whole state is 624 outputs of 32 bits: 312 peer ids of 64. Ids from
    `random.Random` let a client that saw 312 predict the next; the node's must not."""
    config = CONFIG + "[limits]\npeers_per_connection = 400\n"
    with NodeProcess(config, workdir=tmp_path) as node:
        frame = [{"id": i, "op": "new_peer", "expires_in": 60} for i in range(313)]
        answers = sorted(ws_session(node, [frame]), key=lambda answer: answer["id"])
        ids = [answer["ok"] for answer in answers]
        assert next_mersenne_id(ids[:312]) != ids[312]
        bystander(node)
    rng = random.Random(16)  # the attack works where it should
    seen = [rng.getrandbits(64) for _ in range(313)]
    assert next_mersenne_id(seen[:312]) == seen[312]


def next_mersenne_id(ids: list[int]) -> int:
    """The id a Mersenne Twister that gave these 312 ids (getrandbits(64)) gives next."""

    def untemper(y: int) -> int:
        y ^= y >> 18
        y ^= (y << 15) & 0xEFC60000
        x = y
        for _ in range(5):
            x = y ^ ((x << 7) & 0x9D2C5680)
        y = x & 0xFFFFFFFF
        x = y
        for _ in range(3):
            x = y ^ (x >> 11)
        return x & 0xFFFFFFFF

    words = [word for peer_id in ids for word in (peer_id & 0xFFFFFFFF, peer_id >> 32)]
    clone = random.Random()
    clone.setstate((3, (*(untemper(word) for word in words), 624), None))
    return clone.getrandbits(64)


def test_rate_limit_keys_and_their_length_are_bounded(tmp_path):
    config = (
        CONFIG
        + '[rate_limits]\napi = { algorithm = "gcra", burst = 10, rate = 5 }\n'
        + "[limits]\nrate_limit_keys = 200\n"
    )
    with NodeProcess(config, workdir=tmp_path) as node:
        before = node.rss_mb()
        checks = [{"id": i, "op": "check", "limiter": "api", "key": f"k{i}"} for i in range(300)]
        huge = [{"id": 300, "op": "check", "limiter": "api", "key": "x" * 900_000}]
        answers = ws_session(node, [checks, huge] * 5)
        codes = [a.get("error", "go") for a in answers]
        # Each time: keys k0 to k199 are kept and decided, k200 to k299 refused.
        assert codes.count("go") == 1000
        assert codes.count("quota_full") == 500
        assert codes.count("beyond_limit") == 5
        # Refusals quote at most 200 characters of what they were sent.
        assert max(len(a.get("message", "")) for a in answers) < 300
        assert node.rss_mb() - before < 50
        status, body = request(node, "POST", "/rate_limits/api/check?key=new")
        assert status == 429 and json.loads(body)["error"] == "quota_full"
        assert request(node, "POST", "/rate_limits/api/check?key=k1")[0] == 200
        bystander(node)


def test_expiries_long_polls_and_restores_past_their_limits(tmp_path):
    config = CONFIG + '[limits]\nlongest_block_for = "1s"\n'
    with NodeProcess(config, workdir=tmp_path) as node:
        status, body = request(node, "POST", "/new_peer", b'{"expires_in":"1000000000years"}')
        assert status == 400
        assert body.endswith(b"is longer than 7.776e+06 s ([limits] longest_expires_in)")
        status, body = request(
            node,
            "POST",
            "/restore",
            b'{"expires_in":"1h","peer_id":7,"acquired":{"B":%d}}' % (2**63 - 1),
        )
        assert (status, body) == (
            400,
            b"a restore of count 9223372036854775807 of 'B' is too large ([limits] restore_count)",
        )
        holder, waiter = holder_and_waiter(node, "B", "1m")
        started = time.monotonic()
        status, _ = request(node, "PUT", f"/peers/{waiter}/B?block_for=1000000000years", b"1")
        assert status == 202 and 0.9 < time.monotonic() - started < 3
        assert request(node, "DELETE", f"/peers/{holder}")[0] == 200
        assert request(node, "GET", "/remainder?semaphore=B") == (200, b"0")  # the waiter has it
        bystander(node)


def test_waiting_acquires_of_one_peer_are_bounded(tmp_path):
    with NodeProcess(CONFIG, workdir=tmp_path) as node:
        before = node.rss_mb()
        holder, waiter = holder_and_waiter(node, "B", "1m")
        waits = [
            {"id": i, "op": "acquire", "peer": waiter, "semaphore": "B", "wait": 1}
            for i in range(10_000)
        ]
        answers = ws_session(node, [waits])
        codes = [a.get("error", "ok") for a in answers]
        assert codes.count("quota_full") == 10_000 - 16
        assert codes.count("ok") == 16  # each "not yet" after its second
        assert node.rss_mb() - before < 50
        bystander(node)


def test_waiting_acquires_of_a_node_are_bounded(tmp_path):
    with NodeProcess(CONFIG + "[limits]\nwaits = 50\n", workdir=tmp_path) as node:
        holder, _ = holder_and_waiter(node, "B", "1m")
        waiters = [
            json.loads(request(node, "POST", "/new_peer", b'{"expires_in":"1m"}')[1])
            for _ in range(60)
        ]
        waits = [
            {"id": i, "op": "acquire", "peer": peer, "semaphore": "B", "wait": 1}
            for i, peer in enumerate(waiters)
        ]
        answers = ws_session(node, [waits])
        refused = [a for a in answers if a.get("error") == "quota_full"]
        assert len(refused) == 10 and len(answers) - len(refused) == 50
        assert refused[0]["message"] == "this node has 50 acquires waiting ([limits] waits)"
        status, body = request(node, "PUT", f"/peers/{waiters[0]}/B?block_for=1s", b"1")
        assert (status, body) == (202, str(waiters[0]).encode())  # room again once they ran out
        bystander(node)


def test_sigterm_stops_the_node_within_a_second_with_600_abusive_sockets_open(tmp_path):
    import signal

    with NodeProcess(CONFIG, workdir=tmp_path) as node:
        held = []
        try:
            for number in range(600):
                sock = connect(node)
                # Half of them stop in the request line, half in a WebSocket handshake.
                sock.sendall(b"GET /" if number % 2 else b"GET /ws HTTP/1.1\r\nHost: x\r\n")
                held.append(sock)
            time.sleep(0.3)
            started = time.monotonic()
            node.signal(signal.SIGTERM)
            assert node.wait(10) == 0
            assert time.monotonic() - started < 1.0
        finally:
            for sock in held:
                sock.close()
