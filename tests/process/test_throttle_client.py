"""The stock `throttle-client` from PyPI against a real node process, unchanged."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from throttle_client import Client, Peer, PeerWithHeartbeat, Timeout, lock
from throttle_client.client import UnknownPeer

from tests.nodes import wait_healthy

pytestmark = pytest.mark.process


def test_client_methods(node):
    client = Client(node.url)
    peer_id = client.new_peer(expires_in=timedelta(minutes=1))
    assert client.acquire(peer_id, "C", count=3) is True
    assert client.remainder("C") == 2
    assert client.is_acquired(peer_id) is True
    client.heartbeat(peer_id, expires_in=timedelta(minutes=1))

    other = client.new_peer(expires_in=timedelta(minutes=1))
    assert client.acquire(other, "C", count=3) is False
    assert client.is_acquired(other) is False
    client.release_lock(peer_id, "C")
    assert client.is_acquired(other) is True
    assert client.remainder("C") == 2

    client.release(other)
    client.release(peer_id)
    assert client.remainder("C") == 5
    with pytest.raises(UnknownPeer):
        client.heartbeat(peer_id, expires_in=timedelta(minutes=1))


def test_client_domain_errors_become_value_errors(node):
    client = Client(node.url)
    peer_id = client.new_peer(expires_in=timedelta(minutes=1))
    with pytest.raises(ValueError, match="^Unknown semaphore$"):
        client.acquire(peer_id, "Nope")
    with pytest.raises(ValueError, match="Lock can never be acquired"):
        client.acquire(peer_id, "A", count=2)
    with pytest.raises(ValueError, match="^Unknown semaphore$"):
        client.remainder("Nope")


def test_names_with_reserved_characters(node):
    client = Client(node.url)
    peer_id = client.new_peer(expires_in=timedelta(minutes=1))
    assert client.acquire(peer_id, "a/b&c%", count=2) is True
    assert client.remainder("a/b&c%") == 0
    client.release_lock(peer_id, "a/b&c%")
    assert client.remainder("a/b&c%") == 2
    assert client.acquire(peer_id, "ünï code") is True
    assert client.remainder("ünï code") == 0


def test_lock_context_manager(node):
    with lock(node.url, "C", count=4):
        assert Client(node.url).remainder("C") == 1
    assert Client(node.url).remainder("C") == 5


def test_nested_locks_follow_levels(node):
    # B has level 1, A level 0: B then A is the allowed order.
    with lock(node.url, "B"):
        with lock(node.url, "A"):
            assert Client(node.url).remainder("A") == 0
            assert Client(node.url).remainder("B") == 0
    assert Client(node.url).remainder("A") == 1

    with lock(node.url, "A"):
        with pytest.raises(ValueError, match="Lock hierachy violation"):
            with lock(node.url, "B"):
                pass


def test_lock_timeout(node):
    holder = Peer.from_server_url(node.url)
    assert holder.acquire("A")
    started = time.monotonic()
    with pytest.raises(Timeout):
        with lock(node.url, "A", timeout=timedelta(seconds=0.5)):
            pass
    assert time.monotonic() - started < 5
    holder.remove_from_server()


def test_waiting_lock_is_granted_when_released(node):
    holder = Peer.from_server_url(node.url)
    assert holder.acquire("A")
    acquired_at: list[float] = []

    def waiter() -> None:
        with lock(node.url, "A", timeout=timedelta(seconds=20)):
            acquired_at.append(time.monotonic())

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.5)
    assert acquired_at == []
    released_at = time.monotonic()
    holder.release("A")
    thread.join(20)
    assert not thread.is_alive()
    # block_for long polls answer at the grant, not at the end of the poll.
    assert acquired_at and acquired_at[0] - released_at < 1.0
    holder.remove_from_server()


def test_peer_with_heartbeat_outlives_its_expiry(node):
    client = Client(node.url)
    peer = PeerWithHeartbeat(
        client,
        expiration_time=timedelta(seconds=1),
        heartbeat_interval=timedelta(seconds=0.2),
    )
    assert peer.acquire("A")
    peer.start_heartbeat()
    try:
        time.sleep(2.5)
        assert client.remainder("A") == 0
        assert client.is_acquired(peer.id)
    finally:
        peer.stop_heartbeat()
    # Without heartbeats the peer expires and its lock is freed.
    deadline = time.monotonic() + 5
    while client.remainder("A") != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.remainder("A") == 1


def test_restore_after_the_node_was_killed(node):
    client = Client(node.url)
    peer = PeerWithHeartbeat(
        client,
        expiration_time=timedelta(seconds=30),
        heartbeat_interval=timedelta(seconds=0.2),
    )
    assert peer.acquire("C", count=3)
    peer.acquired["C"] = 3
    assert client.remainder("C") == 2

    node.kill()
    node.restart()
    wait_healthy(node.url)
    assert client.remainder("C") == 5  # the node forgot everything

    # The heartbeat thread meets `Unknown peer` and restores the peer with its locks.
    peer.start_heartbeat()
    try:
        deadline = time.monotonic() + 10
        while client.remainder("C") != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.remainder("C") == 2
        assert client.is_acquired(peer.id)
    finally:
        peer.stop_heartbeat()
    peer.remove_from_server()
    assert client.remainder("C") == 5


def test_lock_survives_a_restart_inside_the_with_block(node):
    with lock(node.url, "A") as peer:
        node.kill()
        node.restart()
        wait_healthy(node.url)
        peer.restore()
        assert Client(node.url).remainder("A") == 0
    assert Client(node.url).remainder("A") == 1


def test_sigterm_stops_within_a_second_with_exit_code_zero(node):
    client = Client(node.url)
    peer_id = client.new_peer(expires_in=timedelta(minutes=1))
    client.acquire(peer_id, "A")
    waiting = client.new_peer(expires_in=timedelta(minutes=1))
    results = []
    # A long poll in flight must not hold the shutdown up.
    thread = threading.Thread(
        target=lambda: results.append(client.acquire(waiting, "A", block_for=timedelta(seconds=30)))
    )
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    code = node.stop()
    assert code == 0
    assert time.monotonic() - started < 1.0
    thread.join(5)
    assert results == [False]
