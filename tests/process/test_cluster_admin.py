"""What an operator asks of a cluster from afar, proving the cluster secret: `sluicegate drain
NODE` (`POST /drain`), a graceful leave, refused when it would leave no majority, followed until
done; `sluicegate forget NODE` (`POST /forget`), a member dead for good stops counting, refused
while it is alive."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from sluicegate.node.cluster_admin import (
    PROOF_WINDOW,
    authorization,
    leaves_a_majority,
    refusal,
)
from tests.nodes import NodeProcess, cluster_of, is_ready, wait_until

SECRET = "drain-test-secret-0123456789"
CONFIG = '[semaphores]\nA = 2\n[cluster]\ndown_after = "1s"\ngossip_interval = "200ms"\n'


def test_a_proof_names_one_action_one_node_one_secret_and_a_time_window():
    now, secret = 1_800_000_000, SECRET.encode()
    header = authorization(secret, "drain", "n3", now)
    assert refusal(header, secret, "drain", "n3", now + 5) is None
    assert "does not match" in refusal(header, secret, "drain", "n2", now)
    assert "does not match" in refusal(header, secret, "forget", "n3", now)
    assert "does not match" in refusal(header, b"another-secret-0123456789", "drain", "n3", now)
    assert "good for" in refusal(header, secret, "drain", "n3", now + PROOF_WINDOW + 1)
    assert "needs the header" in refusal(None, secret, "drain", "n3", now)
    assert "is not Sluicegate-HMAC" in refusal("Bearer x", secret, "drain", "n3", now)


def test_a_drain_must_leave_a_majority_of_the_members_counted():
    assert leaves_a_majority(live=3, counted=3)
    assert not leaves_a_majority(live=2, counted=3)  # one down already: 1 of 2 left
    assert leaves_a_majority(live=4, counted=5)
    assert not leaves_a_majority(live=1, counted=1)


def admin(url: str, *args: str, secret: str | None = SECRET) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin"}
    if secret is not None:
        env["SLUICEGATE_CLUSTER_SECRET"] = secret
    return subprocess.run(
        [sys.executable, "-m", "sluicegate.node.admin", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def member_state(node: NodeProcess, node_id: str) -> str | None:
    with urllib.request.urlopen(f"{node.url}/status.json", timeout=5) as answer:
        members = json.loads(answer.read())["members"]
    return next((m["state"] for m in members if m["id"] == node_id), None)


def post(node: NodeProcess, path: str, header: str | None) -> tuple[int, str]:
    request = urllib.request.Request(f"{node.url}{path}", data=b"", method="POST")
    if header is not None:
        request.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.process
def test_a_member_drained_hands_its_slots_on_and_stops_and_the_others_serve(tmp_path):
    with cluster_of(tmp_path, CONFIG, {"SLUICEGATE_CLUSTER_SECRET": SECRET}) as nodes:
        n3 = nodes[2]
        assert post(n3, "/drain", None)[0] == 401
        wrong = authorization(b"not-the-cluster-secret-0123", "drain", "n3", int(time.time()))
        assert post(n3, "/drain", wrong)[0] == 401
        assert (
            post(n3, "/drain", authorization(SECRET.encode(), "drain", "n2", int(time.time())))[0]
            == 401
        )
        refused = admin(nodes[0].url, "drain", "n3", secret=None)
        assert refused.returncode == 2 and "needs the cluster secret" in refused.stderr
        assert is_ready(n3.url)

        done = admin(nodes[0].url, "drain", "n3")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Draining n3" in done.stdout
        assert done.stdout.rstrip().endswith("n3 has left, and its slots are with the others.")
        assert n3.wait(timeout=10) == 0
        assert "Asked to drain (POST /drain), shutting down." in n3.log()
        wait_until(lambda: all(is_ready(n.url) for n in nodes[:2]), 10, "n1 and n2 ready")
        assert new_peer(nodes[0]) == 200

        # Two members left, both live: draining one would leave 1 of 1, a majority; but with
        # n2 killed, n1 alone is 1 of 2 counted, and draining it is refused.
        nodes[1].kill()
        wait_until(lambda: member_state(nodes[0], "n2") == "down", 15, "n1 counts n2 down")
        proof = authorization(SECRET.encode(), "drain", "n1", int(time.time()))
        status, body = post(nodes[0], "/drain", proof)
        assert status == 409 and "no majority" in body


def members_of(node: NodeProcess) -> set[str]:
    with urllib.request.urlopen(f"{node.url}/status.json", timeout=5) as answer:
        return {m["id"] for m in json.loads(answer.read())["members"]}


def new_peer(node: NodeProcess) -> int:
    request = urllib.request.Request(
        f"{node.url}/new_peer", data=b'{"expires_in": "60s"}', method="POST"
    )
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.process
def test_members_killed_and_replaced_under_new_ids_are_forgotten_and_the_cluster_serves(tmp_path):
    env = {"SLUICEGATE_CLUSTER_SECRET": SECRET}
    with cluster_of(tmp_path, CONFIG, env) as nodes:
        live = list(nodes)
        for new_id in ("n4", "n5", "n6"):
            live.pop(0).kill()
            args = ["--node-id", new_id, "--join", f"127.0.0.1:{live[0].port}"]
            replacement = NodeProcess(CONFIG, workdir=tmp_path / new_id, args=args, env=env)
            nodes.append(replacement.start())  # killed when the block ends
            live.append(replacement)
            # Up, and it knows every member (not ready: with two dead counted, a new life
            # cannot read enough of the others to recover).
            wait_until(lambda r=replacement: members_of(r) == members_of(live[0]), 20, "joined")
        # Six members counted, three of them live: no majority.
        dead = ("n1", "n2", "n3")
        wait_until(
            lambda: all(member_state(live[0], d) == "down" for d in dead), 20, "the dead down"
        )
        assert new_peer(live[0]) == 503
        refused = admin(live[0].url, "forget", "n5")
        assert refused.returncode == 1 and "n5 is alive" in refused.stderr
        for node_id in dead:
            done = admin(live[1].url, "forget", node_id)
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"{node_id} is forgotten: all 3 members up know." in done.stdout
        assert all(member_state(n, d) == "forgotten" for n in live for d in dead)
        wait_until(lambda: all(is_ready(n.url) for n in live), 20, "the three live ready")
        assert all(new_peer(n) == 200 for n in live)


@pytest.mark.process
def test_a_member_restarted_while_another_is_down_serves_once_the_down_one_is_forgotten(tmp_path):
    """A rolling restart with one member of three down: the restarted member's new life has
    lost its memory, and the down member's is out of reach, so it cannot read what a quorum
    with its previous life committed (docs/cluster.md, "Availability"). The operator forgets
    the down member; the two left recover from each other and serve, and the down member, back
    under its own id, is a member again."""
    env = {"SLUICEGATE_CLUSTER_SECRET": SECRET}
    with cluster_of(tmp_path, CONFIG, env) as nodes:
        n1, n2, n3 = nodes
        assert new_peer(n1) == 200
        n3.kill()
        wait_until(lambda: member_state(n1, "n3") == "down", 15, "n1 counts n3 down")
        n2.kill()
        n2.restart()
        wait_until(lambda: member_state(n2, "n1") == "up", 20, "n2's new life hears n1")
        wait_until(lambda: new_peer(n1) == 503, 20, "n1 alone cannot commit")
        assert not is_ready(n2.url), "n2 cannot recover from n1 alone while n3 counts"

        done = admin(n1.url, "forget", "n3")
        assert done.returncode == 0, done.stdout + done.stderr
        wait_until(lambda: is_ready(n1.url) and is_ready(n2.url), 20, "n1 and n2 ready")
        assert new_peer(n1) == 200 and new_peer(n2) == 200

        n3.restart()
        wait_until(lambda: all(is_ready(n.url) for n in nodes), 30, "all three ready")
        assert all(member_state(n1, m) == "up" for m in ("n2", "n3"))
        assert new_peer(n3) == 200
