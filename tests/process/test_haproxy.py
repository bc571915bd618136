"""HAProxy (deploy/haproxy.cfg, as deployed) in front of real node processes.

Two independent nodes (no cluster yet) are only asked stateless questions: how HAProxy spreads
requests, and how fast it stops sending them to a killed node. The stock throttle-client runs
through HAProxy against one node. HAProxy must be installed (`make test` does it): these tests
fail, never skip, without it.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import requests
from throttle_client import Client, Peer, lock
from throttle_client.client import UnknownPeer

from tests.conftest import NODE_CONFIG
from tests.haproxy import HaproxyNotInstalled, HaproxyProcess, haproxy_binary, render_config
from tests.nodes import NodeProcess, wait_healthy

pytestmark = pytest.mark.process

# Each of the two nodes gets a semaphore named after itself; GET /metrics, a read-only route,
# lists it and so tells which node answered.
TWO_NODE_CONFIG = '[semaphores]\nA = 1\n"node-{}" = 1\n'
# `inter 500 fall 2`: DOWN after two failed checks, 0.5 to 1 s after a kill.
DETECTION_WINDOW = 2.0


def require_haproxy() -> str:
    """The haproxy binary; a failure (never a skip: CI must prove HAProxy works) without it."""
    try:
        return haproxy_binary()
    except HaproxyNotInstalled as error:
        message = str(error)
    pytest.fail(message, pytrace=False)


@contextlib.contextmanager
def balancer(nodes: list[NodeProcess], workdir: Path) -> Iterator[HaproxyProcess]:
    """HAProxy in front of `nodes`; its log is printed (shown by pytest) when the test fails."""
    require_haproxy()
    lb = HaproxyProcess([node.url for node in nodes], workdir=workdir)
    with lb:
        try:
            yield lb
        except BaseException:
            print(f"--- haproxy log ({lb.log_path}) ---\n{lb.log()}")
            raise


@pytest.fixture
def two_nodes(tmp_path):
    for name in ("n1", "n2"):
        (tmp_path / name).mkdir()
    with (
        NodeProcess(TWO_NODE_CONFIG.format(1), workdir=tmp_path / "n1") as n1,
        NodeProcess(TWO_NODE_CONFIG.format(2), workdir=tmp_path / "n2") as n2,
    ):
        yield n1, n2


def wait_for_down(lb: HaproxyProcess, server: str, since: float) -> float:
    """When (wall clock) HAProxy logged `server` DOWN after `since`; bounded wait."""
    pattern = re.compile(rf"^(\S+) Server sluicegate_nodes/{server} is DOWN", re.MULTILINE)
    deadline = time.monotonic() + DETECTION_WINDOW + 2.0
    while time.monotonic() < deadline:
        for match in pattern.finditer(lb.log()):
            logged = datetime.fromisoformat(match.group(1)).timestamp()
            if logged >= since:
                return logged
        time.sleep(0.05)
    raise AssertionError(f"HAProxy did not mark {server} DOWN:\n{lb.log()}")


def served_by(response: requests.Response) -> str:
    found = re.search(r'semaphore="(node-\d)"', response.text)
    return found.group(1) if found else f"? {response.status_code} {response.text[:60]!r}"


# -- the config itself ------------------------------------------------------------------------


def test_haproxy_is_installed():
    assert os.access(require_haproxy(), os.X_OK)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_deploy_config_is_valid_without_warnings(tmp_path, count):
    config = tmp_path / "haproxy.cfg"
    urls = [f"http://127.0.0.1:{8001 + i}" for i in range(count)]
    config.write_text(render_config(urls), encoding="utf-8")
    result = subprocess.run(
        [require_haproxy(), "-c", "-f", str(config)],
        env=dict(os.environ, SLUICEGATE_LB_BIND="127.0.0.1:8080"),
        capture_output=True,
        text=True,
        timeout=10,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output and "ALERT" not in output, output
    assert config.read_text().rstrip().endswith(f"server n{count} 127.0.0.1:{8000 + count}")


# -- two independent nodes, stateless routes --------------------------------------------------


def test_requests_are_spread_round_robin(two_nodes, tmp_path):
    with balancer(list(two_nodes), tmp_path / "lb") as lb:
        # A new connection per request.
        fresh = [served_by(requests.get(f"{lb.url}/metrics", timeout=5)) for _ in range(20)]
        assert sorted(set(fresh)) == ["node-1", "node-2"], fresh
        assert fresh.count("node-1") == fresh.count("node-2") == 10, fresh
        # One keep-alive connection: HAProxy still balances each request on its own, so
        # consecutive requests of one client land on different nodes.
        with requests.Session() as session:
            kept = [served_by(session.get(f"{lb.url}/metrics", timeout=5)) for _ in range(10)]
        assert kept.count("node-1") == kept.count("node-2") == 5, kept

        for path, body in [("/", "Hello from Throttle!"), ("/health", "Ok")]:
            for _ in range(4):
                response = requests.get(f"{lb.url}{path}", timeout=5)
                assert (response.status_code, response.text) == (200, body)
        direct = requests.get(f"{two_nodes[0].url}/version", timeout=5).text
        assert requests.get(f"{lb.url}/version", timeout=5).text == direct


def test_killed_node_is_taken_out_of_rotation(two_nodes, tmp_path):
    n1, n2 = two_nodes
    with balancer([n1, n2], tmp_path / "lb") as lb:
        results: list[tuple[float, str]] = []  # (time sent, node or error)
        stop = threading.Event()

        def load() -> None:
            with requests.Session() as session:
                while not stop.is_set():
                    sent = time.monotonic()
                    try:
                        outcome = served_by(session.get(f"{lb.url}/metrics", timeout=5))
                    except requests.RequestException as error:
                        outcome = f"error {error!r}"
                    results.append((sent, outcome))
                    time.sleep(0.01)

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        try:
            time.sleep(0.3)
            killed_at, killed_wall = time.monotonic(), time.time()
            n1.kill()
            down_at = wait_for_down(lb, "n1", killed_wall)
            # Enough requests after the window to show that none fail or reach n1.
            window_end = max(killed_at + DETECTION_WINDOW, time.monotonic() + 0.5)
            time.sleep(max(0.0, window_end + 1.0 - time.monotonic()))
        finally:
            stop.set()
            thread.join(10)
        assert not thread.is_alive()

        before = [outcome for sent, outcome in results if sent < killed_at]
        assert {"node-1", "node-2"} <= set(before), before
        # The window ends at the detection limit, and never before HAProxy has acted on it.
        window_end = max(killed_at + DETECTION_WINDOW, killed_at + (down_at - killed_wall) + 0.5)
        window = [outcome for sent, outcome in results if killed_at <= sent < window_end]
        after = [outcome for sent, outcome in results if sent >= window_end]
        assert len(after) >= 5, after
        assert set(after) == {"node-2"}, after
        # Inside the window, retries with `option redispatch 1` hide the dead node; the one
        # thing a client may see is its keep-alive connection cut when `on-marked-down
        # shutdown-sessions` ends the sessions tied to the dead server (the stock client retries
        # that). Never an answer from the dead node.
        cut = {o for o in window if o.startswith("error ") and "Connection aborted" in o}
        assert set(window) - cut == {"node-2"}, window
        print(f"n1 marked DOWN {down_at - killed_wall:.3f}s after SIGKILL")
        assert down_at - killed_wall < DETECTION_WINDOW

        # Back on the same port: UP again after `rise 2` checks, and in rotation.
        n1.restart()
        wait_healthy(n1.url)
        deadline = time.monotonic() + 5.0
        seen: set[str] = set()
        while seen != {"node-1", "node-2"} and time.monotonic() < deadline:
            seen.add(served_by(requests.get(f"{lb.url}/metrics", timeout=5)))
            time.sleep(0.05)
        assert seen == {"node-1", "node-2"}, seen


def test_all_nodes_down_answers_503_at_once(tmp_path):
    (tmp_path / "n1").mkdir()
    with NodeProcess(NODE_CONFIG, workdir=tmp_path / "n1") as node:
        with balancer([node], tmp_path / "lb") as lb:
            killed_at = time.time()
            node.kill()
            # Inside the detection window a request waits for its retries (1 s turn-around,
            # there is no other server to redispatch to), then gets 503.
            down_at = wait_for_down(lb, "n1", killed_at)
            assert down_at - killed_at < DETECTION_WINDOW
            # Once the node is DOWN, HAProxy answers 503 itself, at once.
            started = time.monotonic()
            response = requests.get(f"{lb.url}/health", timeout=10)
            assert response.status_code == 503
            assert time.monotonic() - started < 0.5


# -- one node, the stock throttle-client through HAProxy --------------------------------------


def test_lock_with_count(shared_node, tmp_path):
    with balancer([shared_node], tmp_path) as lb:
        with lock(lb.url, "C", count=4):
            assert Client(lb.url).remainder("C") == 1
        assert Client(lb.url).remainder("C") == 5


def test_nested_locks_follow_levels(shared_node, tmp_path):
    with balancer([shared_node], tmp_path) as lb:
        with lock(lb.url, "B"):
            with lock(lb.url, "A"):
                assert Client(lb.url).remainder("A") == 0
                assert Client(lb.url).remainder("B") == 0
        assert Client(lb.url).remainder("A") == 1

        with lock(lb.url, "A"):
            with pytest.raises(ValueError, match="Lock hierachy violation"):
                with lock(lb.url, "B"):
                    pass
        assert Client(lb.url).remainder("A") == 1
        assert Client(lb.url).remainder("B") == 1


def test_block_for_long_poll_is_answered_at_release(shared_node, tmp_path):
    with balancer([shared_node], tmp_path) as lb:
        holder = Peer.from_server_url(lb.url)
        assert holder.acquire("A")
        acquired_at: list[float] = []

        def waiter() -> None:
            # lock() long polls with block_for=5s: HAProxy must pass the answer on at once.
            with lock(lb.url, "A", timeout=timedelta(seconds=20)):
                acquired_at.append(time.monotonic())

        thread = threading.Thread(target=waiter)
        thread.start()
        try:
            time.sleep(0.5)
            assert acquired_at == []
            released_at = time.monotonic()
            holder.release("A")
        finally:
            thread.join(20)
        assert not thread.is_alive()
        assert acquired_at and acquired_at[0] - released_at < 1.0
        holder.remove_from_server()
        assert Client(lb.url).remainder("A") == 1


def test_block_for_runs_out_without_being_cut(shared_node, tmp_path):
    with balancer([shared_node], tmp_path) as lb:
        client = Client(lb.url)
        holder = client.new_peer(expires_in=timedelta(minutes=1))
        waiting = client.new_peer(expires_in=timedelta(minutes=1))
        try:
            assert client.acquire(holder, "A") is True
            started = time.monotonic()
            assert client.acquire(waiting, "A", block_for=timedelta(seconds=2)) is False
            assert 1.9 < time.monotonic() - started < 3.5
        finally:
            client.release(waiting)
            client.release(holder)
        assert client.remainder("A") == 1


def test_remainder_and_odd_names(shared_node, tmp_path):
    # Names with `/`, `&`, `%` and non-ASCII travel percent-encoded in paths and queries; HAProxy
    # must not normalise or reject them.
    names = {"C": 2, "a/b&c%": 2, "ünï code": 1}
    with balancer([shared_node], tmp_path) as lb:
        client = Client(lb.url)
        assert [client.remainder(name) for name in names] == [5, 2, 1]
        # One peer per semaphore: they share lock level 0, so one peer could hold only one.
        peers = [client.new_peer(expires_in=timedelta(minutes=1)) for _ in names]
        try:
            for peer, (name, count) in zip(peers, names.items(), strict=True):
                assert client.acquire(peer, name, count=count) is True
                assert client.is_acquired(peer) is True
            assert [client.remainder(name) for name in names] == [3, 0, 0]
        finally:
            for peer in peers:
                client.release(peer)
        assert [client.remainder(name) for name in names] == [5, 2, 1]


def test_unknown_peer_reaches_the_client(shared_node, tmp_path):
    with balancer([shared_node], tmp_path) as lb:
        with pytest.raises(UnknownPeer):
            Client(lb.url).heartbeat(123, expires_in=timedelta(minutes=1))


# Raw requests whose answers must come through byte for byte, headers included.
ERROR_REQUESTS = [
    ("PUT", "/peers/123", {"json": {"expires_in": "5m"}}, 400),  # Unknown peer
    ("GET", "/peers/123/is_acquired", {}, 400),  # Unknown peer
    ("GET", "/remainder?semaphore=Nope", {}, 400),  # Unknown semaphore
    ("PUT", "/peers/123/A", {"json": 2}, 409),  # Lock can never be acquired
    ("PUT", "/peers/123", {"data": b"{}"}, 415),  # no JSON content type
    ("GET", "/nope", {}, 404),  # HTML page
    ("DELETE", "/", {}, 405),  # Allow header, empty body
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status"), ERROR_REQUESTS)
def test_errors_pass_through_unchanged(shared_node, tmp_path, method, path, kwargs, status):
    with balancer([shared_node], tmp_path) as lb:
        direct = requests.request(method, f"{shared_node.url}{path}", timeout=5, **kwargs)
        proxied = requests.request(method, f"{lb.url}{path}", timeout=5, **kwargs)
    assert direct.status_code == proxied.status_code == status
    assert proxied.content == direct.content
    for header in ("content-type", "content-length", "allow"):
        assert proxied.headers.get(header) == direct.headers.get(header), header
    if path.startswith(("/peers", "/remainder")) and status in (400, 409):
        # Throttle's domain errors: the message alone, no Content-Type at all.
        assert "content-type" not in proxied.headers
        assert proxied.content in (
            b"Unknown peer",
            b"Unknown semaphore",
            b"Lock can never be acquired. Lock asks for count 2 yet full count is only 1.",
        )
