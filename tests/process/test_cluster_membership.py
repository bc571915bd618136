"""Membership across real node processes: join through a seed, goodbye, silent death, restart,
and links refused without the secret."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from sluicegate.cluster.ring import Ring
from sluicegate.cluster.slots import SLOTS, slot_owners
from tests.nodes import NodeProcess, gauge, wait_until

pytestmark = pytest.mark.process

CONFIG = (
    """
[semaphores]
A = 1
"""
    + "".join(f"S{i} = 2\n" for i in range(29))
    + """

[cluster]
down_after = "2s"
gossip_interval = "200ms"
"""
)
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "membership-test-secret"}


def members_up(node: NodeProcess) -> int | None:
    value = gauge(node, "sluicegate_members_up")
    return int(value) if value is not None else None


def start_node(tmp_path, name: str, join: NodeProcess | None = None, env=SECRET) -> NodeProcess:
    args = ["--node-id", name]
    if join is not None:
        args += ["--join", f"127.0.0.1:{join.port}"]
    return NodeProcess(CONFIG, workdir=tmp_path / name, args=args, env=env).start()


@pytest.fixture
def cluster(tmp_path):
    nodes: dict[str, NodeProcess] = {}
    nodes["n1"] = start_node(tmp_path, "n1")
    for name in ("n2", "n3"):
        nodes[name] = start_node(tmp_path, name, join=nodes["n1"])
    yield nodes
    for node in nodes.values():
        node.kill()


def test_nodes_joining_through_a_seed_converge(cluster):
    wait_until(lambda: all(members_up(n) == 3 for n in cluster.values()), 10, "all see 3 members")


def test_goodbye_removes_a_member_at_once_and_silence_after_the_timeout(cluster):
    wait_until(lambda: all(members_up(n) == 3 for n in cluster.values()), 10, "converged")

    assert cluster["n3"].stop() == 0
    wait_until(
        lambda: members_up(cluster["n1"]) == 2 and members_up(cluster["n2"]) == 2,
        30,
        "n3's goodbye seen",
    )
    for node in ("n1", "n2"):  # the goodbye, not the 2 s silence timeout
        assert "Member n3 left." in cluster[node].log()
        assert "Member n3 is down" not in cluster[node].log()

    cluster["n2"].kill()
    took = wait_until(lambda: members_up(cluster["n1"]) == 1, 30, "n2 declared down")
    assert took > 1.0  # down_after is 2 s
    assert "Member n2 is down (silent)." in cluster["n1"].log()
    assert gauge(cluster["n1"], "sluicegate_members_down") == 1.0  # n3 left: not counted
    wait_until(
        lambda: (
            "1 of 2 members are down and still counted for the quorum: n2." in cluster["n1"].log()
        ),
        5,
        "n1 names the member down",
    )


def test_a_restarted_node_rejoins(cluster, tmp_path):
    wait_until(lambda: all(members_up(n) == 3 for n in cluster.values()), 10, "converged")
    cluster["n2"].kill()
    cluster["n2"].restart()
    # n1 sees n2 come up twice: at the first join and as the restarted generation (n1 may
    # still count the first one up when n2 is back, so counting members alone would race).
    wait_until(
        lambda: cluster["n1"].log().count("Member n2 is up") == 2, 10, "n1 sees the new life"
    )
    wait_until(lambda: all(members_up(n) == 3 for n in cluster.values()), 10, "n2 back everywhere")


def test_a_node_without_the_secret_is_refused(cluster, tmp_path):
    wait_until(lambda: members_up(cluster["n1"]) == 3, 10, "converged")
    intruder = start_node(
        tmp_path,
        "intruder",
        join=cluster["n1"],
        env={"SLUICEGATE_CLUSTER_SECRET": "a-guess-of-16-bytes"},
    )
    try:
        wait_until(
            lambda: "does not know the cluster secret" in cluster["n1"].log(),
            30,
            "n1 refuses the intruder",
        )
        assert members_up(cluster["n1"]) == 3
        assert members_up(intruder) == 1
    finally:
        intruder.kill()


def test_the_cluster_route_is_closed_on_a_single_node(node):
    async def try_link() -> str:
        try:
            async with open_websocket_url(f"ws://127.0.0.1:{node.port}/cluster") as ws:
                await ws.get_message()
        except HandshakeError as error:
            return type(error).__name__
        except ConnectionClosed as closed:
            return f"closed {closed.reason.code}"
        return "open"

    assert trio.run(try_link) in ("ConnectionRejected", "closed 1008")


def test_joining_without_a_secret_is_a_configuration_error(tmp_path):
    config = tmp_path / "node.toml"
    config.write_text("[semaphores]\nA = 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate.node", "-c", str(config), "--join", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=20,
        env={k: v for k, v in os.environ.items() if k != "SLUICEGATE_CLUSTER_SECRET"},
    )
    assert result.returncode == 2
    assert "a cluster needs a shared secret" in result.stderr


def test_sigint_on_a_cluster_node_exits_zero_within_a_second(cluster):
    wait_until(lambda: members_up(cluster["n1"]) == 3, 10, "converged")
    started = time.monotonic()
    cluster["n1"].signal(signal.SIGINT)
    assert cluster["n1"].wait(5) == 0
    assert time.monotonic() - started < 1.0


def test_a_cluster_node_bound_to_any_address_must_say_where_it_is_reached(tmp_path):
    config = tmp_path / "node.toml"
    config.write_text("[semaphores]\nA = 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate.node", "-c", str(config), "--address", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=20,
        env=dict(os.environ, **SECRET),
    )
    assert result.returncode == 2
    assert "set --advertise HOST:PORT (or [cluster] advertise" in result.stderr


def test_every_node_acts_for_the_slots_the_ring_gives_it(cluster):
    wait_until(lambda: all(members_up(n) == 3 for n in cluster.values()), 10, "converged")
    owners = slot_owners(Ring(["n1", "n2", "n3"]))
    expected = {name: float(owners.count(name)) for name in cluster}
    assert sum(expected.values()) == SLOTS and all(expected.values())

    def acting(names=tuple(cluster)) -> dict[str, float]:
        return {name: gauge(cluster[name], "sluicegate_slots_acting") for name in names}

    # Each node takes the members on once they have settled (down_after).
    wait_until(lambda: acting() == expected, 10, f"slots as the ring says: {expected}")

    cluster["n3"].stop()
    wait_until(lambda: members_up(cluster["n1"]) == 2, 5, "n3 gone")
    wait_until(lambda: members_up(cluster["n2"]) == 2, 5, "n3 gone")
    # n3 resigned its slots as it left; the survivors take them, as the ring of two says.
    owners = slot_owners(Ring(["n1", "n2"]))
    expected = {name: float(owners.count(name)) for name in ("n1", "n2")}
    wait_until(lambda: acting(expected) == expected, 5, "n3's share moved")


def test_gossip_lag_of_live_members_stays_below_the_timeout(cluster):
    wait_until(lambda: members_up(cluster["n1"]) == 3, 10, "converged")
    with urllib.request.urlopen(f"{cluster['n1'].url}/metrics", timeout=2) as response:
        text = response.read().decode()
    lags = dict(re.findall(r'^sluicegate_gossip_lag_seconds\{node="(\w+)"\} (\S+)$', text, re.M))
    assert set(lags) == {"n2", "n3"}
    assert all(0 <= float(lag) < 2.0 for lag in lags.values())
