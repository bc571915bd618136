"""`sluicegate status | semaphores | peers` (node/admin.py) against real nodes."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from tests.nodes import NodeProcess, cluster_of, wait_until

pytestmark = pytest.mark.process

CONFIG = "[semaphores]\nA = 2\nB = 1\nC = 5\n"
CLUSTER = CONFIG + '[cluster]\ndown_after = "1s"\ngossip_interval = "200ms"\n'
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "admin-test-secret-0123456789"}


def admin(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sluicegate.node.admin", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def request(method: str, url: str, body: bytes | None = None) -> str:
    headers = {"content-type": "application/json"} if body is not None else {}
    call = urllib.request.Request(url, data=body, method=method, headers=headers)
    with urllib.request.urlopen(call, timeout=10) as answer:
        return answer.read().decode()


def hold(url: str, semaphore: str, count: int) -> int:
    peer = int(request("POST", f"{url}/new_peer", b'{"expires_in": "1m"}'))
    request("PUT", f"{url}/peers/{peer}/{semaphore}", str(count).encode())
    return peer


def test_a_single_node_its_semaphores_and_peers(tmp_path):
    with NodeProcess(CONFIG, workdir=tmp_path) as node:
        holder = hold(node.url, "A", 2)
        hold(node.url, "A", 1)  # waits
        done = admin(node.url, "status")
        assert done.returncode == 0 and "single node" in done.stdout, done.stderr
        done = admin(node.url, "semaphores")
        assert done.returncode == 0, done.stderr
        row = next(line.split() for line in done.stdout.splitlines() if line.startswith("A "))
        assert row[:4] == ["A", "2", "2", "1"]
        found = json.loads(admin(node.url, "--json", "semaphores").stdout)["semaphores"]
        assert [(s["name"], s["acquired"], s["pending"]) for s in found] == [
            ("A", 2, 1),
            ("B", 0, 0),
            ("C", 0, 0),
        ]
        listed = admin(node.url, "peers")
        assert listed.stdout.splitlines()[0] == "2 peers" and str(holder) in listed.stdout


def test_a_cluster_every_member_and_every_semaphore_once(tmp_path):
    with cluster_of(tmp_path, CLUSTER, SECRET) as nodes:
        hold(nodes[1].url, "C", 3)
        done = admin(nodes[0].url, "status")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("node n1 at ") and ", ready: acts for " in done.stdout
        members = [
            line.split() for line in done.stdout.splitlines() if line[:2] in ("n1", "n2", "n3")
        ]
        assert [(m[0], m[3]) for m in members] == [("n1", "up"), ("n2", "up"), ("n3", "up")]
        assert [m[-1] for m in members[1:]] == ["up", "up"]
        found = json.loads(admin(nodes[2].url, "--json", "semaphores").stdout)
        assert sorted(s["name"] for s in found["semaphores"]) == ["A", "B", "C"]
        assert next(s for s in found["semaphores"] if s["name"] == "C")["acquired"] == 3
        nodes[2].kill()
        wait_until(
            lambda: " down " in admin(nodes[0].url, "status").stdout, 10, "n1 counts n3 down"
        )
        report = json.loads(admin(nodes[0].url, "--json", "status").stdout)
        assert [m["state"] for m in report["members"]] == ["up", "up", "down"]


def test_a_node_that_does_not_answer_is_exit_2(tmp_path):
    done = admin("http://127.0.0.1:9", "status")
    assert done.returncode == 2 and "sluicegate: http://127.0.0.1:9/status.json" in done.stderr
