"""sluicegate's own client against three real nodes behind real HAProxy: many tasks locking at
once, the blocking API from threads, the node a client talks to killed mid-lock (under asyncio
and under trio), and the whole cluster restarted under held locks."""

from __future__ import annotations

import threading

import anyio
import pytest
import trio

from sluicegate import client as sg
from tests.nodes import is_ready, wait_until
from tests.process.test_cluster_throttle import cluster  # noqa: F401 (the fixture)

pytestmark = pytest.mark.process

TIMEOUT = 60


def ws(balancer) -> str:
    return "ws://" + balancer.url.split("//", 1)[1]


async def test_many_tasks_lock_through_the_balancer_with_rising_tokens(cluster):  # noqa: F811
    _, balancer = cluster
    inside = most = 0
    tokens: list[int] = []

    async def worker(client):
        nonlocal inside, most
        for _ in range(3):
            async with client.lock("C", timeout=20) as lease:
                tokens.append(lease.fencing_token)
                inside += 1
                most = max(most, inside)
                await trio.sleep(0.02)
                inside -= 1

    with trio.fail_after(TIMEOUT):
        async with await sg.connect(ws(balancer)) as client:
            async with trio.open_nursery() as nursery:
                for _ in range(16):
                    nursery.start_soon(worker, client)
            assert await client.remainder("C") == 5
    assert most == 5
    assert len(set(tokens)) == len(tokens) == 48


def test_the_blocking_api_from_threads_through_the_balancer(cluster):  # noqa: F811
    _, balancer = cluster
    errors: list[Exception] = []
    held: list[int] = []

    def worker() -> None:
        try:
            for _ in range(2):
                with sg.lock(ws(balancer), "A", timeout=20) as lease:
                    held.append(lease.fencing_token)
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert errors == []
    assert held == sorted(held) and len(set(held)) == 12  # A is a mutex: one grant at a time


@pytest.mark.anyio  # under asyncio and under trio
async def test_the_node_a_holder_talks_to_is_killed_and_the_lease_holds(cluster):  # noqa: F811
    nodes, balancer = cluster
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(ws(balancer), expires_in=3) as holder:
            async with holder.lock("C", count=3) as lease:
                victim = nodes[holder.node]  # the node ids of the cluster fixture
                victim.kill()
                async with await sg.connect(ws(balancer)) as other:
                    # The holder reconnects elsewhere and keeps heartbeating: nothing beyond max.
                    await anyio.sleep(4)
                    assert not lease.lost
                    assert await other.remainder("C") == 2
                    async with other.lock("C", count=2, timeout=20) as second:
                        assert second.fencing_token > lease.fencing_token
                    with pytest.raises(sg.LockTimeout):
                        async with other.lock("C", count=3, timeout=1):
                            pass
            victim.restart()
            async with holder.lock("C", count=5, timeout=20):  # the waiter proceeds
                pass


async def test_clients_restore_and_carry_on_after_every_node_restarted(cluster):  # noqa: F811
    nodes, balancer = cluster
    with trio.fail_after(TIMEOUT):
        async with await sg.connect(ws(balancer), expires_in=10) as client:
            async with client.lock("C", count=2) as lease:
                for node in nodes.values():
                    node.kill()
                for node in nodes.values():
                    node.restart()
                await trio.to_thread.run_sync(
                    lambda: wait_until(
                        lambda: all(is_ready(n.url) for n in nodes.values()), 20, "all ready"
                    )
                )
                # The heartbeats meet unknown peers and restore them, with exactly this lock.
                while await _remainder_or_none(client, "C") != 3:
                    await trio.sleep(0.2)
                assert not lease.lost
                async with await sg.connect(ws(balancer)) as other:
                    async with other.lock("C", count=3, timeout=10) as after:
                        assert after.fencing_token is not None
                        assert await other.remainder("C") == 0  # the restored 2 still count
            assert await client.remainder("C") == 5


async def _remainder_or_none(client, semaphore: str) -> int | None:
    try:
        return await client.remainder(semaphore)
    except sg.Unavailable:
        return None
