"""Three real nodes behind a real HAProxy, driven by the stock throttle-client from PyPI.

Consecutive requests land on different nodes (HAProxy balances round robin), so a peer's requests
reach its home through other nodes. The owner of a held semaphore, and the home of a holder, are
killed with SIGKILL, and come back: what a quorum holds survives, with no restore.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from datetime import timedelta

import msgpack
import pytest
import trio
from throttle_client import Client, PeerWithHeartbeat, lock
from throttle_client.client import UnknownPeer
from trio_websocket import ConnectionRejected, open_websocket_url

from sluicegate.cluster.ring import Ring, peer_key, semaphore_key
from sluicegate.cluster.semaphore_ops import PEER_PAGE
from sluicegate.cluster.slots import SLOTS, member_for, takeover_bound
from tests.haproxy import HaproxyProcess
from tests.nodes import NodeProcess, gauge, is_ready, wait_until

pytestmark = pytest.mark.process

CONFIG = """
[semaphores]
A = 1
B = { max = 1, level = 1 }
C = 5

[cluster]
down_after = "1s"
gossip_interval = "200ms"
"""
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "cluster-test-secret"}


def owner(nodes: dict[str, NodeProcess], semaphore: str) -> NodeProcess:
    """The node that owns `semaphore` while all of `nodes` are members."""
    return nodes[member_for(Ring(nodes), semaphore_key(semaphore))]


def serve_every_slot(nodes: list[NodeProcess]) -> bool:
    """Do `nodes` act for every slot between them (each holding the lease of its own)?"""
    return sum(gauge(n, "sluicegate_slots_acting") or 0 for n in nodes) == SLOTS


def heartbeating_holders(client: Client, semaphore: str, counts: list[int]) -> list:
    """Peers holding `semaphore` with these counts, each heartbeating every 0.3 s in a thread
    (and restoring its locks when its home forgot it)."""
    holders = []
    for count in counts:
        peer = PeerWithHeartbeat(
            client,
            expiration_time=timedelta(minutes=1),
            heartbeat_interval=timedelta(seconds=0.3),
        )
        assert peer.acquire(semaphore, count=count)
        peer.start_heartbeat()
        holders.append(peer)
    return holders


def known_and_acquired(client: Client, peer_id: int) -> bool:
    try:
        return client.is_acquired(peer_id)
    except UnknownPeer:
        return False


def fencing_token(url: str, peer_id: int, semaphore: str, count: int) -> int:
    """Ask again for a held lock (idempotent) and read its token from the response header."""
    request = urllib.request.Request(
        f"{url}/peers/{peer_id}/{semaphore}",
        data=str(count).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return int(response.headers["sluicegate-fencing-token"])


def ws_answer(url: str, request: dict) -> dict:
    """The answer of the node at `url` to one request over `/ws`."""

    async def ask() -> dict:
        with trio.fail_after(15):
            async with open_websocket_url(f"ws://{url.split('//', 1)[1]}/ws") as ws:
                await ws.send_message(msgpack.packb({"hello": 1}))
                await ws.get_message()
                await ws.send_message(msgpack.packb([dict(request, id=1)]))
                [answer] = msgpack.unpackb(await ws.get_message())
                return answer

    return trio.run(ask)


class RemainderSampler:
    """Reads a semaphore's remainder through the balancer every 50 ms, in a thread; 503s (no
    node can answer yet) are skipped, not retried."""

    def __init__(self, url: str, semaphore: str) -> None:
        self.url = f"{url}/remainder?semaphore={semaphore}"
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(10)
        return self.samples

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    self.samples.append(int(response.read()))
            except (urllib.error.HTTPError, OSError):
                pass
            time.sleep(0.05)


@contextmanager
def running_cluster(tmp_path, config: str = CONFIG):
    """Three ready nodes (n1 to n3) and HAProxy in front of them: (nodes by id, balancer)."""
    nodes = {
        "n1": NodeProcess(config, workdir=tmp_path / "n1", args=["--node-id", "n1"], env=SECRET)
    }
    try:
        nodes["n1"].start()
        for name in ("n2", "n3"):
            nodes[name] = NodeProcess(
                config,
                workdir=tmp_path / name,
                args=["--node-id", name, "--join", f"127.0.0.1:{nodes['n1'].port}"],
                env=SECRET,
            ).start()
        balancer = HaproxyProcess([n.url for n in nodes.values()], workdir=tmp_path / "haproxy")
        try:
            balancer.start()
            wait_until(
                lambda: all(
                    is_ready(n.url) and gauge(n, "sluicegate_members_up") == 3
                    for n in nodes.values()
                ),
                15,
                "three ready members",
            )
            yield nodes, balancer
        finally:
            balancer.kill()
    finally:
        for node in nodes.values():
            node.kill()


@pytest.fixture
def cluster(tmp_path):
    with running_cluster(tmp_path) as (nodes, balancer):
        yield nodes, balancer


def test_the_stock_client_works_through_the_load_balancer(cluster):
    nodes, balancer = cluster
    url = balancer.url
    with lock(url, "C", count=4):
        assert Client(url).remainder("C") == 1
        with pytest.raises(ValueError, match="Lock can never be acquired"):
            Client(url).acquire(Client(url).new_peer(timedelta(minutes=1)), "C", count=6)
    assert Client(url).remainder("C") == 5
    with lock(url, "B"):
        with lock(url, "A"):
            assert Client(url).remainder("A") == 0
    # Each slot has one node acting for it, and requests that landed away from their peer's
    # home were forwarded there.
    assert serve_every_slot(list(nodes.values()))
    forwarding = [n for n in nodes.values() if gauge(n, "sluicegate_requests_forwarded_total")]
    assert len(forwarding) >= 2


def test_a_waiter_is_granted_through_another_node_at_the_release(cluster):
    _, balancer = cluster
    holder = PeerWithHeartbeat.from_server_url(balancer.url)
    assert holder.acquire("A")
    granted_at: list[float] = []

    def waiter() -> None:
        with lock(balancer.url, "A", timeout=timedelta(seconds=20)):
            granted_at.append(time.monotonic())

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.5)
    released_at = time.monotonic()
    holder.release("A")
    thread.join(20)
    assert granted_at and granted_at[0] - released_at < 1.0
    holder.remove_from_server()


def test_holders_keep_their_leases_when_the_owner_is_killed(cluster):
    nodes, balancer = cluster
    url = balancer.url
    client = Client(url)
    holders = heartbeating_holders(client, "C", [3, 2])
    token_before = fencing_token(url, holders[0].id, "C", 3)
    assert client.remainder("C") == 0

    victim = owner(nodes, "C")
    survivors = [n for n in nodes.values() if n is not victim]
    sampler = RemainderSampler(balancer.url, "C")
    sampler.start()
    victim.kill()

    # A survivor takes C over from what a quorum holds, holders and all (and the slots of a
    # holder homed at the victim too): nobody restores anything.
    wait_until(lambda: serve_every_slot(survivors), 10, "takeover")
    assert Client(survivors[0].url).remainder("C") == 0

    # Nothing is granted beyond max while the holders hold, and a waiter gets in after a release.
    waiter = client.new_peer(timedelta(minutes=1))
    assert client.acquire(waiter, "C", count=1) is False
    assert Client(survivors[1].url).remainder("C") == 0
    holders[1].stop_heartbeat()
    holders[1].remove_from_server()
    wait_until(lambda: client.is_acquired(waiter), 10, "waiter granted after the release")
    token_after = fencing_token(survivors[0].url, waiter, "C", 1)
    assert token_after > token_before

    # The killed node comes back, recovers from the survivors, and takes its slots back.
    victim.restart()
    wait_until(lambda: is_ready(victim.url), 15, "restarted node ready")
    assert Client(victim.url).remainder("C") == 1  # holder 0 (3) and the waiter (1) of 5
    assert known_and_acquired(client, holders[0].id)
    assert client.is_acquired(waiter)
    # The same token, or a newer one if the waiter's home moved back with the restart (its new
    # home names the lock anew: docs/protocol.md).
    assert fencing_token(url, waiter, "C", 1) >= token_after
    holders[0].stop_heartbeat()
    samples = sampler.stop()
    # Through the kill, the takeover and the restart, never more than max was granted.
    assert len(samples) > 20
    assert min(samples) >= 0, samples


def test_clients_rebuild_the_state_after_the_whole_cluster_lost_its_memory(cluster):
    nodes, balancer = cluster
    client = Client(balancer.url)
    holders = heartbeating_holders(client, "C", [3, 2])

    for node in nodes.values():
        node.kill()
    for node in nodes.values():
        node.restart()
    wait_until(lambda: all(is_ready(n.url) for n in nodes.values()), 15, "all nodes back")
    # A cold start: no grace. The heartbeat threads meet `Unknown peer` and restore.
    wait_until(lambda: client.remainder("C") == 0, 40, "holders restored")
    waiter = client.new_peer(timedelta(minutes=1))
    assert client.acquire(waiter, "C", count=1) is False
    holders[1].stop_heartbeat()
    holders[1].remove_from_server()
    wait_until(lambda: client.is_acquired(waiter), 10, "waiter granted after the release")
    assert client.remainder("C") == 1
    holders[0].stop_heartbeat()
    assert sum(gauge(n, "sluicegate_restores_beyond_max_total") for n in nodes.values()) == 0


def test_a_node_cut_off_from_a_quorum_answers_503_until_the_others_are_back(cluster):
    nodes, balancer = cluster
    [holder] = heartbeating_holders(Client(nodes["n1"].url), "C", [2])
    paused = [nodes["n2"], nodes["n3"]]
    for node in paused:
        node.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: not is_ready(nodes["n1"].url), 10, "n1 holds no lease")
        for path in ("/remainder?semaphore=C", f"/peers/{holder.id}/is_acquired"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{nodes['n1'].url}{path}", timeout=5)
            assert refused.value.code == 503
    finally:
        for node in paused:
            node.signal(signal.SIGCONT)
    wait_until(lambda: all(is_ready(n.url) for n in nodes.values()), 20, "all serve again")
    # Nobody served while no quorum was up, and nothing was lost: the holder holds on, with no
    # restore.
    via = Client(balancer.url)
    assert via.is_acquired(holder.id) and via.remainder("C") == 3
    holder.stop_heartbeat()
    assert sum(gauge(n, "sluicegate_restores_beyond_max_total") for n in nodes.values()) == 0


def test_a_503_over_ws_says_whether_the_node_reaches_a_quorum(cluster):
    """A node that hears of most members adds `retry_here_for` to its 503, the longest its
    request's slot takes to get a new owner: our client stays with it. A node cut off from most
    adds nothing: the client moves on."""
    nodes, _ = cluster
    victim = owner(nodes, "A")
    survivor, other = (n for n in nodes.values() if n is not victim)
    remainder = {"op": "remainder", "semaphore": "A"}
    victim.signal(signal.SIGSTOP)
    try:
        # Forwarded to the victim, and refused once the survivor counts it down.
        answer = ws_answer(survivor.url, remainder)
        assert answer["error"] == "unavailable" and "retry_here_for" in answer, answer
        assert answer["retry_here_for"] == pytest.approx(takeover_bound(1.0, 1.0))
        other.signal(signal.SIGSTOP)
        wait_until(
            lambda: gauge(survivor, "sluicegate_slots_acting") == 0,
            10,
            "the survivor acts for no slot",
        )
        answer = ws_answer(survivor.url, remainder)
        assert answer["error"] == "unavailable" and "retry_here_for" not in answer
    finally:
        for node in (victim, other):
            node.signal(signal.SIGCONT)


def test_restores_beyond_max_are_counted_at_the_owner(cluster):
    nodes, balancer = cluster
    for peer_id in (101, 102):
        request = urllib.request.Request(
            f"{balancer.url}/restore",
            data=b'{"expires_in":"1m","peer_id":%d,"acquired":{"C":5}}' % peer_id,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.read() == b"Ok"
    assert Client(balancer.url).remainder("C") == -5
    counted = [gauge(n, "sluicegate_restores_beyond_max_total") for n in nodes.values()]
    assert sorted(counted) == [0, 0, 1]


def test_a_successor_goes_on_from_what_a_quorum_holds_without_any_restore(cluster):
    nodes, balancer = cluster
    victim = owner(nodes, "A")
    survivors = [n for n in nodes.values() if n is not victim]
    # Peers homed at a survivor (a node draws the ids of the peers it creates from its share).
    client = Client(survivors[0].url)
    holder = client.new_peer(timedelta(minutes=5))
    waiter = client.new_peer(timedelta(minutes=5))
    assert client.acquire(holder, "A") is True
    assert client.acquire(waiter, "A") is False

    victim.kill()
    wait_until(lambda: serve_every_slot(survivors), 10, "takeover")
    successor = owner({k: n for k, n in nodes.items() if n is not victim}, "A")
    assert gauge(successor, "sluicegate_slots_changed_total", change="gained") >= 1

    # Nobody restored anything: the new owner knows the holder and the waiting order.
    direct = Client(balancer.url)
    assert direct.is_acquired(holder) is True
    assert direct.is_acquired(waiter) is False
    assert direct.remainder("A") == 0
    direct.release(holder)
    assert direct.is_acquired(waiter)  # the release is answered once the waiter has it
    direct.release(waiter)


def test_peers_whose_home_is_killed_keep_their_locks_with_no_restore(cluster):
    nodes, balancer = cluster
    name, victim = next((k, n) for k, n in nodes.items() if n is not owner(nodes, "A"))
    client = Client(victim.url)
    holder = client.new_peer(timedelta(minutes=5))
    assert member_for(Ring(nodes), peer_key(holder)) == name
    assert client.acquire(holder, "A") is True

    victim.kill()
    survivors = [n for n in nodes.values() if n is not victim]
    wait_until(lambda: serve_every_slot(survivors), 10, "takeover")
    via = Client(balancer.url)
    assert via.is_acquired(holder)  # its new home has it as it was: no `Unknown peer`
    other = via.new_peer(timedelta(minutes=5))
    assert via.acquire(other, "A") is False
    assert via.remainder("A") == 0
    via.release(holder)
    assert via.is_acquired(other)


def test_peers_are_listed_from_every_member_a_page_at_a_time(tmp_path):
    """A member with more peers than fit in one answer over a node link (`PEER_PAGE`) is asked
    again for halves of the id range, until every page fits."""
    config = CONFIG + "[limits]\npeers_per_connection = 60000\n"
    with running_cluster(tmp_path, config) as (nodes, _):
        made = trio.run(new_peers, nodes["n1"].url, PEER_PAGE + 5000)
        made.add(Client(nodes["n2"].url).new_peer(timedelta(minutes=1)))
        for node in nodes.values():
            with urllib.request.urlopen(f"{node.url}/peers/", timeout=60) as answer:
                assert {entry["id"] for entry in json.load(answer)} == made
        with urllib.request.urlopen(f"{nodes['n3'].url}/peers/?limit=3", timeout=10) as answer:
            assert len(json.load(answer)) == 3


async def new_peers(url: str, count: int) -> set[int]:
    """`count` peers made through the node at `url` (so homed there), over one /ws connection."""
    made: set[int] = set()
    with trio.fail_after(60):
        async with open_websocket_url(f"ws://{url.split('//', 1)[1]}/ws") as ws:
            await ws.send_message(msgpack.packb({"hello": 1}))
            await ws.get_message()
            for start in range(0, count, 1000):
                frame = [
                    {"id": i, "op": "new_peer", "expires_in": 60}
                    for i in range(start, min(count, start + 1000))
                ]
                await ws.send_message(msgpack.packb(frame))
                while len(made) < start + len(frame):
                    answers = msgpack.unpackb(await ws.get_message())
                    assert all("ok" in a for a in answers), answers[:3]
                    made |= {a["ok"] for a in answers}
    return made


def test_node_links_are_not_reachable_through_the_balancer(cluster):
    _, balancer = cluster

    async def open_link(url: str) -> str:
        try:
            async with open_websocket_url(f"ws://{url.split('//', 1)[1]}/cluster") as ws:
                with trio.fail_after(5):
                    await ws.get_message()  # a node's challenge, had it been let through
                return "linked"
        except ConnectionRejected as rejected:
            return f"rejected {rejected.status_code}"

    assert trio.run(open_link, balancer.url) == "rejected 404"


def test_a_rolling_restart_keeps_every_lease_without_any_restore(cluster):
    nodes, balancer = cluster
    client = Client(balancer.url)
    holder = client.new_peer(timedelta(minutes=5))
    waiter = client.new_peer(timedelta(minutes=5))
    assert client.acquire(holder, "A") is True
    assert client.acquire(waiter, "A") is False  # plain requests: nobody will ever restore

    late_holders = []
    for node in nodes.values():
        # Acquired just before the stop: a quorum has it before the client hears of it.
        late = client.new_peer(timedelta(minutes=5))
        assert client.acquire(late, "C", count=1)
        late_holders.append(late)
        assert node.stop() == 0
        survivors = [n for n in nodes.values() if n is not node]
        wait_until(lambda s=survivors: serve_every_slot(s), 10, "the survivors serve it all")
        node.restart()
        wait_until(lambda node=node: is_ready(node.url), 15, "restarted node ready")
        via = Client(node.url)
        assert via.is_acquired(holder) is True
        assert via.is_acquired(waiter) is False
        assert via.remainder("A") == 0
        assert all(via.is_acquired(late) for late in late_holders)
        assert via.remainder("C") == 5 - len(late_holders)
