"""`GET /status.json`'s rate limiters, and `?all=1`: every other up member's own answer.

One that does not answer in time (stopped with SIGSTOP) is named with why.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

import pytest
import trio

from .nodes import NodeProcess, wait_until

pytestmark = pytest.mark.process

CONFIG = """[semaphores]
A = 2
B = 1
C = 5

[rate_limits]
api = { algorithm = "fixed_window", limit = 5, window = "1h" }
crawl = { algorithm = "fixed_window", limit = 3, window = "1h", mode = "gossip" }
"""
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "status-page-test-secret-0123456789"}


def request(method: str, url: str, body: bytes | None = None) -> tuple[int, str]:
    headers = {"content-type": "application/json"} if body is not None else {}
    call = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(call, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def check(url: str, limiter: str, times: int) -> list[int]:
    """`times` rate-limit checks of one key: their statuses (a 503, while the key's slot changes
    hands, is asked again for at most 20 s)."""
    statuses = []
    deadline = time.monotonic() + 20
    while len(statuses) < times:
        status, body = request("POST", f"{url}/rate_limits/{limiter}/check?key=k")
        if status != 503:
            statuses.append(status)
        elif time.monotonic() > deadline:
            raise AssertionError(f"a check of {limiter} is still 503: {body}")
        else:
            time.sleep(0.1)
    return statuses


def members_up(url: str) -> list[str]:
    status, body = request("GET", f"{url}/status.json")
    return [m["id"] for m in json.loads(body)["members"] if m["state"] == "up"]


def test_status_json_all_on_a_single_node(tmp_path):
    with NodeProcess(CONFIG, workdir=tmp_path) as node:
        assert check(node.url, "crawl", 4) == [200, 200, 200, 429]
        status, body = request("GET", f"{node.url}/status.json?all=1")
        assert status == 200, body
        answer = json.loads(body)
        assert answer["member_status"] == []
        assert answer["rate_limiters"] == [
            {"name": "api", "mode": "exact", "go": 0, "sorry": 0, "waiting": 0},
            {"name": "crawl", "mode": "gossip", "go": 3, "sorry": 1, "waiting": 0},
        ]
        assert "member_status" not in json.loads(request("GET", f"{node.url}/status.json")[1])
        status, body = request("GET", f"{node.url}/status.json?all=yes")
        assert (status, body) == (
            400,
            "Failed to deserialize query string: expected 1, true, 0 or false, not 'yes'",
        )


async def test_a_member_that_does_not_answer_is_named(tmp_path):
    """`?all=1` through n1 while n2 is stopped (SIGSTOP) but not yet counted down: n2's entry
    says why it has no answer, within the bound, and n1 still answers."""
    config = CONFIG + '[cluster]\ndown_after = "30s"\ngossip_interval = "200ms"\n'
    n1 = NodeProcess(config, workdir=tmp_path / "n1", args=["--node-id", "n1"], env=SECRET)
    nodes = [n1]
    try:
        n1.start()
        join = ["--node-id", "n2", "--join", f"127.0.0.1:{n1.port}"]
        n2 = NodeProcess(config, workdir=tmp_path / "n2", args=join, env=SECRET)
        nodes.append(n2)
        n2.start()
        # Ready or not, a member answers /status.json; n1 counts n2 up for 30 s after it stops.
        wait_until(lambda: members_up(n1.url) == ["n1", "n2"], 20, "n1 sees n2 up")
        n2.signal(signal.SIGSTOP)
        with trio.fail_after(10):
            status, body = await trio.to_thread.run_sync(
                request, "GET", f"{n1.url}/status.json?all=1"
            )
        assert status == 200, body
        assert json.loads(body)["member_status"] == [{"id": "n2", "error": "no answer within 2 s"}]
    finally:
        for node in nodes:
            node.kill()  # SIGKILL ends a stopped process too
