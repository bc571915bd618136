"""Config drift: nodes gossip a digest of their semaphore and rate-limit definitions, and name
live members configured otherwise (a metric, a WARNING, `sluicegate status`)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import urllib.request

import pytest

from sluicegate.cluster.membership import Membership
from sluicegate.node.config import definitions_digest, parse_config
from tests.nodes import cluster_of, gauge, wait_until

BASE = """
[semaphores]
A = 5
B = { max = 1, level = 1 }

[rate_limits]
api = { algorithm = "token_bucket", capacity = 3, rate = 1 }
"""
CLUSTER = '[cluster]\ndown_after = "1s"\ngossip_interval = "200ms"\n'
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "drift-test-secret-0123456789"}


def digest(text: str) -> str:
    return definitions_digest(parse_config(text))


def test_the_digest_follows_what_decides_answers_and_nothing_else():
    assert digest(BASE) == digest(BASE.replace("A = 5", "A = { max = 5, level = 0 }"))
    assert digest(BASE) == digest(BASE + '[cluster]\ndown_after = "9s"\n')
    assert digest(BASE) != digest(BASE.replace("A = 5", "A = 1"))
    assert digest(BASE) != digest(BASE.replace("level = 1", "level = 2"))
    assert digest(BASE) != digest(BASE.replace("rate = 1", "rate = 2"))
    assert digest(BASE) != digest(BASE.replace("A = 5", "A = 5\nX = 2"))


def gossip_between(a: Membership, b: Membership, now: float) -> None:
    rng = random.Random(0)
    for membership, other in ((a, b), (b, a)):
        for _, gossip in membership.tick(now, rng):
            other.receive(gossip, now)


def test_live_members_with_other_definitions_are_named_and_dead_ones_are_not():
    a = Membership("a", "a", 1, ["b"], down_after=1.0, definitions="one")
    b = Membership("b", "b", 1, ["a"], down_after=1.0, definitions="two")
    same = Membership("c", "c", 1, ["a"], down_after=1.0, definitions="one")
    gossip_between(a, b, 0.0)
    gossip_between(a, same, 0.1)
    assert a.drifted_members() == {"b"}
    assert b.drifted_members() == {"a"}
    for now in (0.5, 1.0, 1.5, 2.0):  # b falls silent
        gossip_between(a, same, now)
    assert a.drifted_members() == set()


@pytest.mark.process
def test_a_member_configured_otherwise_is_named_by_the_others(tmp_path):
    other = {"n3": BASE.replace("A = 5", "A = 1") + CLUSTER}
    with cluster_of(tmp_path, BASE + CLUSTER, SECRET, configs=other) as nodes:
        wait_until(lambda: gauge(nodes[0], "sluicegate_members_drifted") == 1, 10, "n1 names n3")
        assert gauge(nodes[1], "sluicegate_members_drifted") == 1
        assert gauge(nodes[2], "sluicegate_members_drifted") == 2
        warning = [line for line in nodes[0].log().splitlines() if "configured with other" in line]
        assert len(warning) == 1 and "n3 (" in warning[0] and "n2" not in warning[0]
        with urllib.request.urlopen(f"{nodes[0].url}/status.json", timeout=5) as response:
            members = {m["id"]: m["definitions"] for m in json.load(response)["members"]}
        assert members["n1"] == members["n2"] == digest(BASE) != members["n3"]
        shown = subprocess.run(
            [sys.executable, "-m", "sluicegate.node.admin", "--url", nodes[0].url, "status"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        assert f"{members['n3']} (differ)" in shown and f"{members['n2']} (differ)" not in shown
        nodes[2].kill()
        wait_until(lambda: gauge(nodes[0], "sluicegate_members_drifted") == 0, 10, "n3 gone")
