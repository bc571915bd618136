"""The status page (`GET /status`) in a real headless Chromium, and `/status.json?all=1` it reads.

Against a real three-node cluster, the page loads and shows the three members up, the semaphores
of all three merged with their gauges, the rate limiters' counts and recent rates, and a name
from the configuration that looks like markup as plain text; when a member is killed it shows it
down; when the node the page talks to is killed it says so and keeps what it showed. Screenshots
go under pytest's tmp_path, and to `SLUICEGATE_SCREENSHOT` if set (docs/status.png, for the
README, is made that way). Without /usr/bin/chromium (`make test` installs it) that test skips,
except in CI (`CI` set), where it fails.

`?all=1` adds every other up member's own answer; one that does not answer in time (stopped with
SIGSTOP) is named with why.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio

from tests.chromium import BINARY, ChromiumProcess, open_page
from tests.nodes import NodeProcess, is_ready, wait_until

pytestmark = pytest.mark.process

# A name that would become an element if the page put it into the DOM as markup.
MARKUP_NAME = '<b id="injected">bold</b>'
CONFIG = f"""[semaphores]
A = 2
B = 1
C = 5
'{MARKUP_NAME}' = 1

[rate_limits]
api = {{ algorithm = "fixed_window", limit = 5, window = "1h" }}
crawl = {{ algorithm = "fixed_window", limit = 3, window = "1h", mode = "gossip" }}
"""
CLUSTER = CONFIG + '[cluster]\ndown_after = "1s"\ngossip_interval = "200ms"\n'
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "status-page-test-secret-0123456789"}
# How long the page may take to show a change (it asks once a second, members within 2 s).
PAGE_TIMEOUT = 20.0


def request(method: str, url: str, body: bytes | None = None) -> tuple[int, str]:
    headers = {"content-type": "application/json"} if body is not None else {}
    call = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(call, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def hold(url: str, semaphore: str, count: int) -> int:
    status, peer = request("POST", f"{url}/new_peer", b'{"expires_in": "1m"}')
    assert status == 200, peer
    status, body = request("PUT", f"{url}/peers/{peer}/{semaphore}", str(count).encode())
    assert status in (200, 202), body
    return int(peer)


def check(url: str, limiter: str, times: int) -> list[int]:
    """`times` rate-limit checks of one key: their statuses (a 503, while the key's slot changes
    hands, is asked again for at most 20 s)."""
    statuses = []
    deadline = time.monotonic() + 20
    while len(statuses) < times:
        status, body = request("POST", f"{url}/rate_limits/{limiter}/check?key=k")
        if status != 503:
            statuses.append(status)
        elif time.monotonic() > deadline:
            raise AssertionError(f"a check of {limiter} is still 503: {body}")
        else:
            time.sleep(0.1)
    return statuses


def members_up(url: str) -> list[str]:
    status, body = request("GET", f"{url}/status.json")
    return [m["id"] for m in json.loads(body)["members"] if m["state"] == "up"]


def chromium_or_skip() -> None:
    if os.path.exists(BINARY):
        return
    reason = f"{BINARY} is missing: `make test` installs it (apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; in CI the status page must be tested, not skipped")
    pytest.skip(reason)


def start_cluster(tmp_path: Path) -> list[NodeProcess]:
    """n1, n2 and n3 on free loopback ports, n2 and n3 joining n1, all ready; killed on error."""
    nodes = [NodeProcess(CLUSTER, workdir=tmp_path / "n1", args=["--node-id", "n1"], env=SECRET)]
    try:
        nodes[0].start()
        join = ["--join", f"127.0.0.1:{nodes[0].port}"]
        for name in ("n2", "n3"):
            args = ["--node-id", name, *join]
            node = NodeProcess(CLUSTER, workdir=tmp_path / name, args=args, env=SECRET)
            nodes.append(node)
            node.start()
        wait_until(lambda: all(is_ready(n.url) for n in nodes), 30, "all three ready")
    except BaseException:
        for node in nodes:
            node.kill()
        raise
    return nodes


# Read from the page: what its tables show, by data attribute.
MEMBERS = """Object.fromEntries([...document.querySelectorAll('#members tbody tr')]
  .map(row => [row.dataset.member, row.querySelector('.state').textContent]))"""
SLOTS_ACTING = """Object.fromEntries([...document.querySelectorAll('#members tbody tr')]
  .map(row => [row.dataset.member, row.cells[7].textContent]))"""
SEMAPHORES = """Object.fromEntries([...document.querySelectorAll('#semaphores tbody tr')]
  .map(row => [row.dataset.semaphore, row.querySelector('.held-of-max').textContent]))"""
LIMITERS = """Object.fromEntries([...document.querySelectorAll('#rate-limiters tbody tr')]
  .map(row => [row.dataset.limiter, [...row.cells].map(cell => cell.textContent)]))"""
CONNECTION = "document.getElementById('connection').dataset.state"


async def shown(page, expression: str) -> dict:
    """The value of one of the expressions above, as the page shows it now."""
    return json.loads(await page.evaluate(f"JSON.stringify({expression})"))


def recent_decisions(cells: list[str]) -> float:
    """Decisions a second of a rate-limiter row's "Last 10 s" cell."""
    found = re.fullmatch(r"([\d.]+) go/s · ([\d.]+) sorry/s", cells[5])
    return 0.0 if found is None else float(found.group(1)) + float(found.group(2))


async def screenshot(page, path: Path) -> None:
    await page.screenshot(path)
    if os.environ.get("SLUICEGATE_SCREENSHOT"):
        await page.screenshot(Path(os.environ["SLUICEGATE_SCREENSHOT"]))


async def test_the_status_page_follows_a_cluster_in_a_real_browser(tmp_path):
    chromium_or_skip()
    nodes = start_cluster(tmp_path)
    n1, n2, n3 = nodes
    chromium = ChromiumProcess(tmp_path / "chromium")
    try:
        hold(n2.url, "C", 3)
        hold(n1.url, "A", 2)
        hold(n3.url, "A", 1)  # waits: A has 2
        assert check(n1.url, "api", 8) == [200] * 5 + [429] * 3

        chromium.start()
        async with open_page(chromium) as page:
            await page.navigate(f"{n1.url}/status")
            await page.wait_for(
                f"JSON.stringify({MEMBERS}) === JSON.stringify({{n1: 'up', n2: 'up', n3: 'up'}})",
                PAGE_TIMEOUT,
                "the page shows n1, n2 and n3 up",
            )
            assert await page.evaluate(CONNECTION) == "live"
            assert await page.evaluate("document.title") == "sluicegate status"
            # n1 asked n2 and n3 (each says its own share, summed to all 256), and merged the
            # semaphores every member owns.
            await page.wait_for(
                f"Object.keys({SEMAPHORES}).length === 4", PAGE_TIMEOUT, "four semaphores"
            )
            slots = await shown(page, SLOTS_ACTING)
            assert sorted(slots) == ["n1", "n2", "n3"] and sum(map(int, slots.values())) == 256
            semaphores = await shown(page, SEMAPHORES)
            assert semaphores == {"A": "2 / 2", "B": "0 / 1", "C": "3 / 5", MARKUP_NAME: "0 / 1"}
            assert await page.evaluate("document.getElementById('injected') === null")
            limiters = await shown(page, LIMITERS)
            assert limiters["api"][:5] == ["api", "exact", "5", "3", "0"]
            assert limiters["crawl"][:3] == ["crawl", "gossip", "0"]
            text = await page.evaluate("document.body.innerText")
            assert "n1" in text and "ready" in text
            await page.screenshot(tmp_path / "status-all-up.png")

            n3.kill()
            await page.wait_for(
                f"JSON.stringify({MEMBERS}) === JSON.stringify({{n1: 'up', n2: 'up', n3: 'down'}})",
                PAGE_TIMEOUT,
                "the page shows n3 down",
            )
            # n1 and n2 take n3's slots over; the page adds their shares up to all 256.
            await page.wait_for(
                "!document.getElementById('ring-legend').textContent.includes('not counted')",
                PAGE_TIMEOUT,
                "n1 and n2 act for every slot",
            )
            assert check(n1.url, "crawl", 6) == [200] * 3 + [429] * 3
            await page.wait_for(
                f"({LIMITERS}).crawl.slice(2, 4).join(' ') === '3 3'",
                PAGE_TIMEOUT,
                "crawl's counts",
            )
            assert recent_decisions((await shown(page, LIMITERS))["crawl"]) > 0
            await screenshot(page, tmp_path / "status-n3-down.png")

            n1.kill()
            await page.wait_for(
                f"{CONNECTION} === 'unreachable'", PAGE_TIMEOUT, "the page says n1 is gone"
            )
            # What it showed last stays.
            members = await shown(page, MEMBERS)
            assert members == {"n1": "up", "n2": "up", "n3": "down"}
            banner = await page.evaluate("document.getElementById('connection').textContent")
            assert banner.startswith("This node does not answer") and "showing what it said" in (
                banner
            )
            await page.screenshot(tmp_path / "status-unreachable.png")
    finally:
        chromium.kill()
        for node in nodes:
            node.kill()


def test_status_json_all_and_the_page_on_a_single_node(tmp_path):
    with NodeProcess(CONFIG, workdir=tmp_path) as node:
        assert check(node.url, "crawl", 4) == [200, 200, 200, 429]
        status, body = request("GET", f"{node.url}/status.json?all=1")
        assert status == 200, body
        answer = json.loads(body)
        assert answer["member_status"] == []
        assert answer["rate_limiters"] == [
            {"name": "api", "mode": "exact", "go": 0, "sorry": 0, "waiting": 0},
            {"name": "crawl", "mode": "gossip", "go": 3, "sorry": 1, "waiting": 0},
        ]
        assert "member_status" not in json.loads(request("GET", f"{node.url}/status.json")[1])
        status, body = request("GET", f"{node.url}/status.json?all=yes")
        assert (status, body) == (
            400,
            "Failed to deserialize query string: expected 1, true, 0 or false, not 'yes'",
        )
        with urllib.request.urlopen(f"{node.url}/status", timeout=10) as page:
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            policy = page.headers["content-security-policy"]
            assert policy.startswith("default-src 'none'; script-src 'sha256-")
            assert "connect-src 'self'" in policy
            assert b"/status.json?all=1" in page.read()


async def test_a_member_that_does_not_answer_is_named(tmp_path):
    """`?all=1` through n1 while n2 is stopped (SIGSTOP) but not yet counted down: n2's entry
    says why it has no answer, within the bound, and n1 still answers."""
    config = CONFIG + '[cluster]\ndown_after = "30s"\ngossip_interval = "200ms"\n'
    n1 = NodeProcess(config, workdir=tmp_path / "n1", args=["--node-id", "n1"], env=SECRET)
    nodes = [n1]
    try:
        n1.start()
        join = ["--node-id", "n2", "--join", f"127.0.0.1:{n1.port}"]
        n2 = NodeProcess(config, workdir=tmp_path / "n2", args=join, env=SECRET)
        nodes.append(n2)
        n2.start()
        # Ready or not, a member answers /status.json; n1 counts n2 up for 30 s after it stops.
        wait_until(lambda: members_up(n1.url) == ["n1", "n2"], 20, "n1 sees n2 up")
        n2.signal(signal.SIGSTOP)
        with trio.fail_after(10):
            status, body = await trio.to_thread.run_sync(
                request, "GET", f"{n1.url}/status.json?all=1"
            )
        assert status == 200, body
        assert json.loads(body)["member_status"] == [{"id": "n2", "error": "no answer within 2 s"}]
    finally:
        for node in nodes:
            node.kill()  # SIGKILL ends a stopped process too
