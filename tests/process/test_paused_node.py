"""A node frozen by SIGSTOP keeps its sockets open, so its links do not break: a request another
node forwarded to it must not wait for it once the others count it down (the chaos runs found
heartbeats waiting out the whole forwarding timeout while another node already served the peer,
which then expired there)."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.error
import urllib.request

import pytest

from sluicegate.cluster.ring import Ring, semaphore_key
from sluicegate.cluster.slots import member_for
from sluicegate.node.semaphore_service import FORWARD_TIMEOUT
from tests.nodes import NodeProcess, gauge, is_ready, wait_until

pytestmark = pytest.mark.process

CONFIG = """
[semaphores]
A = 1

[cluster]
down_after = "1s"
gossip_interval = "200ms"
"""
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "paused-node-test"}


@pytest.fixture
def cluster(tmp_path):
    nodes: dict[str, NodeProcess] = {}
    try:
        for name in ("n1", "n2", "n3"):
            join = ["--join", f"127.0.0.1:{nodes['n1'].port}"] if nodes else []
            nodes[name] = NodeProcess(
                CONFIG, workdir=tmp_path / name, args=["--node-id", name, *join], env=SECRET
            ).start()
        wait_until(lambda: all(is_ready(n.url) for n in nodes.values()), 30, "cluster ready")
        yield nodes
    finally:
        for node in nodes.values():
            node.kill()


def new_peer(node: NodeProcess) -> int:
    """A peer drawn by `node`, so homed there."""
    request = urllib.request.Request(
        f"{node.url}/new_peer",
        data=json.dumps({"expires_in": "1m"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_a_request_forwarded_to_a_frozen_home_is_answered_once_the_home_is_counted_down(cluster):
    home, entry = cluster["n1"], cluster["n2"]
    peer = new_peer(home)
    home.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(
                f"{entry.url}/peers/{peer}/is_acquired", timeout=FORWARD_TIMEOUT + 5
            ) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        waited = time.monotonic() - started
    finally:
        home.signal(signal.SIGCONT)
    # 503 (the home went down before it answered; the client asks again) or, if the entry
    # counted the home down first, the new home's answer. Either way not after the forwarding
    # timeout, but about `down_after` after the freeze.
    assert status in (200, 503)
    assert waited < FORWARD_TIMEOUT / 2, f"waited {waited:.1f} s for a frozen node"


def remainder(node: NodeProcess, semaphore: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{node.url}/remainder?semaphore={semaphore}", timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError:
        return None  # 503: not serving (yet)


def acquire(node: NodeProcess, peer: int, semaphore: str) -> bool:
    """Acquire, waiting up to 10 s (a node that joined late grants nothing during its grace)."""
    request = urllib.request.Request(
        f"{node.url}/peers/{peer}/{semaphore}?block_for=10s",
        data=b"1",
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        return response.status == 200  # 202: still pending


def release(node: NodeProcess, peer: int, semaphore: str) -> None:
    request = urllib.request.Request(f"{node.url}/peers/{peer}/{semaphore}", method="DELETE")
    with urllib.request.urlopen(request, timeout=20):
        pass


CHANGES = ("gained", "lost", "resigned")


def all_logged(node: NodeProcess) -> bool:
    """Has `node` logged every slot change its `sluicegate_slots_changed` counters hold?"""
    logged = [0, 0, 0]
    for line in re.findall(r"Slots: (\d+) gained, (\d+) lost, (\d+) resigned", node.log()):
        logged = [total + int(count) for total, count in zip(logged, line, strict=True)]
    counted = [gauge(node, "sluicegate_slots_changed_total", change=change) for change in CHANGES]
    return logged == counted


def test_a_node_that_wakes_from_a_freeze_acts_for_nothing_it_held_until_it_wins_it_back(cluster):
    """Chaos seeds 3 and 4 (before slot ownership): a node paused longer than `down_after` woke
    with its old state, and granted from its old queues while others served its peers. Now
    it acts for a slot only while it holds a quorum's lease on it: woken, it has lost every
    slot (its leases ran out by its own clock) before it handles anything, and wins its ring
    share back with ballots, from the copies the quorum committed meanwhile."""
    ring = Ring(sorted(cluster))
    name = member_for(ring, semaphore_key("A"))
    frozen = cluster[name]
    others = [node for node_id, node in cluster.items() if node_id != name]
    holder, waiter = new_peer(others[0]), new_peer(others[1])
    assert acquire(others[0], holder, "A") is True
    acting_before = int(gauge(frozen, "sluicegate_slots_acting"))
    assert acting_before > 0
    # Slot changes are logged once a second at most: let the last ones out before the freeze.
    wait_until(lambda: all_logged(frozen), 5, "the frozen node's slot changes to be logged")
    logged_before = len(frozen.log())
    frozen.signal(signal.SIGSTOP)
    try:
        wait_until(
            lambda: sum(gauge(node, "sluicegate_slots_acting") for node in others) == 256,
            15,
            "the others to take the frozen node's slots over",
        )
        assert remainder(others[1], "A") == 0  # the holder's lock came over with the slot
    finally:
        frozen.signal(signal.SIGCONT)
    wait_until(lambda: gauge(frozen, "sluicegate_slots_acting") == acting_before, 15, "back")
    woken = frozen.log()[logged_before:].split("Slots: ")[1:]  # its slot changes since
    assert woken[0].startswith(f"0 gained, {acting_before} lost, 0 resigned; acting for 0")
    assert is_ready(frozen.url)
    # The holder kept A through it all, and the waiter gets it once the holder lets go.
    assert all(remainder(node, "A") == 0 for node in cluster.values())
    release(others[0], holder, "A")
    assert acquire(others[1], waiter, "A") is True
