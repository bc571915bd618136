"""The stock `throttle-client`'s sequential expectations, through HAProxy balancing round robin
over three nodes, so that consecutive requests land on different nodes: once a request was
answered, the next one sees its effect, whichever node it reaches (docs/cluster.md, "Read your
writes"). Each scenario runs again and again on one cluster; a single miss fails it."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from throttle_client import Client, PeerWithHeartbeat, Timeout, get_local_peer, lock

from sluicegate.cluster.ring import Ring, peer_key, semaphore_key
from sluicegate.cluster.slots import member_for
from tests.nodes import is_ready, wait_until
from tests.process.test_cluster_throttle import known_and_acquired, running_cluster

pytestmark = pytest.mark.process

ROUNDS = 25
# The client's own timeout in the restart scenarios (`lock(..., timeout=...)`).
LOCK_TIMEOUT = 10.0
MINUTE = timedelta(minutes=1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("cluster")) as (nodes, balancer):
        yield nodes, balancer


def test_a_release_is_seen_by_the_next_request_on_any_node(cluster):
    _, balancer = cluster
    client = Client(balancer.url)
    for _ in range(ROUNDS):
        holder, waiter, newcomer = (client.new_peer(MINUTE) for _ in range(3))
        assert client.acquire(holder, "A") is True
        assert client.acquire(waiter, "A") is False  # pending, no block_for
        client.release_lock(holder, "A")
        # The grant the release caused reached the waiter's home before the release was
        # answered.
        assert client.is_acquired(waiter) is True
        assert client.remainder("A") == 0
        client.release(waiter)
        assert client.remainder("A") == 1
        # A plain acquire right after a release gets the lock.
        assert client.acquire(newcomer, "A") is True
        client.release(newcomer)
        client.release(holder)


def test_an_expiry_is_seen_by_remainder_at_once(cluster):
    _, balancer = cluster
    client = Client(balancer.url)
    for _ in range(ROUNDS):
        peer = client.new_peer(MINUTE)
        assert client.acquire(peer, "C", count=3) is True
        assert client.remainder("C") == 2
        # A renewal to now: the peer expires, and every node sees its locks go at once.
        client.heartbeat(peer, expires_in=timedelta(0))
        assert client.remainder("C") == 5
        other = client.new_peer(MINUTE)
        assert client.acquire(other, "C", count=4, expires_in=timedelta(0)) is True
        assert client.remainder("C") == 5
    # An expiry that runs out by itself is seen at once too.
    peer = client.new_peer(MINUTE)
    assert client.acquire(peer, "C", count=5, expires_in=timedelta(seconds=0.5)) is True
    assert client.remainder("C") == 0
    time.sleep(0.6)
    assert client.remainder("C") == 5


class Waiter:
    """A thread locking `semaphore` with the stock `lock(..., timeout=LOCK_TIMEOUT)`: when it
    got it (or that it timed out)."""

    def __init__(self, url: str, semaphore: str) -> None:
        self.peer_id: int | None = None
        self.granted_at: float | None = None
        self.timed_out = False
        self._url, self._semaphore = url, semaphore
        self._asked = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Waiter:
        self._thread.start()
        assert self._asked.wait(10)
        return self

    def finish(self) -> None:
        self._release.set()
        self._thread.join(2 * LOCK_TIMEOUT)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        self.peer_id = get_local_peer(self._url).id  # the peer `lock` takes in this thread
        self._asked.set()
        try:
            with lock(self._url, self._semaphore, timeout=timedelta(seconds=LOCK_TIMEOUT)):
                self.granted_at = time.monotonic()
                self._release.wait(2 * LOCK_TIMEOUT)
        except Timeout:
            self.timed_out = True


@pytest.mark.parametrize("killed", ["the waiter's home", "the semaphore's owner", "every node"])
def test_a_killed_and_restarted_node_or_cluster_recovers_a_pending_lock_within_the_timeout(
    tmp_path, killed
):
    with running_cluster(tmp_path) as (nodes, balancer):
        for _ in range(3 if killed == "every node" else 4):
            waited = kill_and_restart_while_a_lock_waits(nodes, balancer.url, killed)
            print(f"{killed}: granted {waited:.1f} s after it asked")


def kill_and_restart_while_a_lock_waits(nodes, url: str, killed: str) -> float:
    """A holder of A heartbeats; a waiter's `lock` waits in line; `killed` are killed and
    started again, then the holder lets go: how long the waiter waited in all."""
    holder = PeerWithHeartbeat(
        Client(url), expiration_time=MINUTE, heartbeat_interval=timedelta(seconds=0.3)
    )
    assert holder.acquire("A")
    holder.start_heartbeat()
    waiter = Waiter(url, "A").start()
    started = time.monotonic()
    time.sleep(0.3)  # its acquire waits in line
    ring = Ring(nodes)
    victims = {
        "the waiter's home": [nodes[member_for(ring, peer_key(waiter.peer_id))]],
        "the semaphore's owner": [nodes[member_for(ring, semaphore_key("A"))]],
        "every node": list(nodes.values()),
    }[killed]
    for node in victims:
        node.kill()
    for node in victims:
        node.restart()
    wait_until(lambda: all(is_ready(n.url) for n in nodes.values()), 10, "ready")
    # (Restored by its heartbeats first, if the cluster forgot it.)
    wait_until(lambda: known_and_acquired(holder.client, holder.id), 10, "holder known")
    holder.stop_heartbeat()
    holder.release("A")
    wait_until(
        lambda: waiter.granted_at is not None or waiter.timed_out,
        2 * LOCK_TIMEOUT,
        "the waiter's lock decided",
    )
    assert not waiter.timed_out, f"{killed}: not granted within {LOCK_TIMEOUT} s"
    waiter.finish()
    holder.remove_from_server()
    return waiter.granted_at - started
