"""Rate limiters in lease mode on real nodes: our clients decide their checks from slices of the
key's budget, several clients share one key within its rule, a plain HTTP check takes from the
same budget, and a key's owner killed mid-way hands out nothing its holders may still spend."""

from __future__ import annotations

import json
import math
import time
import urllib.request

import anyio
import pytest
import trio

from sluicegate import client as sg
from sluicegate.cluster.ring import Ring, rate_key
from sluicegate.cluster.slots import member_for
from tests.nodes import NodeProcess, gauge, wait_until
from tests.process.test_cluster_throttle import running_cluster

pytestmark = pytest.mark.process

TIMEOUT = 60
CAPACITY = 60
# Refills so slowly that nothing refills during a test: what goes is what the bucket held.
CONFIG = f"""
[rate_limits.fetch]
algorithm = "token_bucket"
capacity = {CAPACITY}
rate = 0.0001
mode = "lease"
term = "1s"

[rate_limits.window]
algorithm = "fixed_window"
limit = 5
window = "1s"
mode = "lease"

[cluster]
down_after = "1s"
gossip_interval = "200ms"
"""


def ws_url(process) -> str:
    return "ws://" + process.url.split("//", 1)[1]


async def spend(
    urls: list[str], clients: int, tasks: int, seconds: float, pause: float = 0.0
) -> tuple[int, int]:
    """`clients` clients (taking `urls` in turn), `tasks` tasks each, checking "fetch" for
    `seconds` (`pause` after each go): how many went, and how many requests the clients
    sent."""
    went = sent = 0

    async def client_run(url: str) -> None:
        nonlocal sent
        async with await sg.connect(url) as client:
            end = trio.current_time() + seconds

            async def task() -> None:
                nonlocal went
                while trio.current_time() < end:
                    decision = await client.check("fetch", key="k")
                    went += decision.go
                    await trio.sleep(pause if decision.go else 0.01)

            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(task)
            sent += client.connection.requests_sent

    async with trio.open_nursery() as nursery:
        for number in range(clients):
            nursery.start_soon(client_run, urls[number % len(urls)])
    return went, sent


def metric(node, name: str) -> float | None:
    return gauge(node, name, limiter="fetch")


def http_check(node) -> dict:
    request = urllib.request.Request(f"{node.url}/rate_limits/fetch/check?key=k", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return json.loads(refused.read())


async def test_clients_decide_from_slices_and_share_the_key_within_its_bucket(tmp_path):
    with NodeProcess(CONFIG, workdir=tmp_path / "n1") as node:
        assert http_check(node)["go"]  # a plain check takes from the same budget
        with trio.fail_after(TIMEOUT):
            went, sent = await spend([ws_url(node)] * 4, clients=4, tasks=8, seconds=2.0)
        print(f"lease mode: {went} went of {CAPACITY - 1} left, in {sent} requests")
        assert went <= CAPACITY - 1
        assert went >= (CAPACITY - 1) // 2
        assert sent < went  # most checks were decided by the clients themselves
        assert not http_check(node)["go"]
        # The clients closed their slices as they went, saying what each spent; a slice that
        # ended before its holder said is not counted.
        assert 0 < metric(node, "sluicegate_rate_lease_spent_total") <= went
        assert metric(node, "sluicegate_rate_lease_slices_open") == 0
        # (A client may get none: the others can have spent the bucket before it asks.)
        assert metric(node, "sluicegate_rate_lease_slices_granted_total") >= 1


def test_a_client_under_asyncio_decides_from_its_slices_too(tmp_path):
    async def spend_all(url: str) -> tuple[int, int]:
        async with await sg.connect(url) as client:
            went = 0
            for _ in range(CAPACITY + 10):
                went += (await client.check("fetch", key="a")).go
            return went, client.connection.requests_sent

    with NodeProcess(CONFIG, workdir=tmp_path / "n1") as node:
        went, sent = anyio.run(spend_all, ws_url(node), backend="asyncio")
    assert went == CAPACITY and sent < 20


async def test_rate_limited_waits_at_the_client_for_the_next_window(tmp_path):
    with NodeProcess(CONFIG, workdir=tmp_path / "n1") as node:
        async with await sg.connect(ws_url(node)) as client:
            with trio.fail_after(TIMEOUT):
                admitted = []
                for _ in range(8):
                    async with client.rate_limited("window", timeout=3):
                        admitted.append(time.time())
        windows = [math.floor(at) for at in admitted]
        assert max(windows.count(w) for w in set(windows)) <= 5
        assert len(set(windows)) >= 2


async def test_a_killed_owner_hands_out_nothing_its_holders_may_still_spend(tmp_path):
    with running_cluster(tmp_path, CONFIG) as (nodes, balancer):
        owner = nodes[member_for(Ring(nodes), rate_key("fetch", "k"))]
        others = [node for node in nodes.values() if node is not owner]
        urls = [ws_url(node) for node in others]
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                results = []

                async def run() -> None:
                    results.append(await spend(urls, 2, 2, seconds=6.0, pause=0.1))

                nursery.start_soon(run)
                await trio.sleep(0.6)  # about 24 went; the holders hold slices of the rest
                owner.kill()
            [(went, _)] = results
        # Had the new owner started the key whole, the holders would have spent their slices
        # and then a whole bucket more.
        print(f"lease mode through a failover: {went} went of {CAPACITY}")
        assert 10 <= went <= CAPACITY
        wait_until(lambda: all(gauge(n, "sluicegate_members_up") == 2 for n in others), 15, "2 up")
