"""The examples in examples/, each run as a user would run it, against a node with the
example configuration (`make run`'s)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from sluicegate import client as sg
from tests.nodes import NodeProcess, free_port, wait_until

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    config = (ROOT / "deploy" / "example.toml").read_text()
    with NodeProcess(config, workdir=tmp_path_factory.mktemp("node")) as process:
        yield process


def run_example(name: str, node) -> str:
    done = subprocess.run(
        [sys.executable, ROOT / "examples" / name, f"ws://127.0.0.1:{node.port}"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_asyncio_worker_keeps_each_hosts_pace(node):
    output = run_example("asyncio_worker.py", node)
    fetched: dict[str, list[float]] = {}
    for host, at, token in re.findall(
        r"https://(\S+?)/\S+ fetched at ([\d.]+) s, .+ (\d+)", output
    ):
        fetched.setdefault(host, []).append(float(at))
        assert int(token) > 0
    assert sorted(fetched) == ["a.example", "b.example"] and "done: 6 pages" in output
    for times in fetched.values():  # 2 per host in any second: the third a second after the first
        times.sort()
        assert times[2] - times[0] >= 0.8  # (less what the answers took to come back)


def test_the_trio_script_never_holds_c_beyond_its_count(node):
    output = run_example("trio_script.py", node)
    most = int(re.search(r"at most (\d+) at once", output).group(1))
    assert 1 <= most <= 3
    assert "nightly ran holding B (0 of B left meanwhile)" in output


def test_the_fastapi_app_limits_callers_and_serializes_the_reindex(node, tmp_path):
    port = free_port()
    app = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hypercorn",
            "examples.fastapi_app:app",
            "--bind",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env={"SLUICEGATE_URLS": f"ws://127.0.0.1:{node.port}", "PATH": ""},
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "app.log", "w"),  # noqa: SIM115 (the process's, closed with it)
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(base), 20, "the app answers")
        # 20 at once, then 10/s: on a busy machine the bucket refills while we ask, so ask
        # until the first 429 and hold the admitted count to what the bucket allowed by then.
        started = time.monotonic()
        admitted = 0
        for _ in range(500):
            answer = requests.get(
                f"{base}/search", params={"q": "x"}, headers={"X-User": "ada"}, timeout=5
            )
            if answer.status_code != 200:
                break
            admitted += 1
        elapsed = time.monotonic() - started
        assert answer.status_code == 429
        assert 20 <= admitted <= 20 + 10 * elapsed + 1
        assert int(answer.headers["retry-after"]) >= 1

        with sg.BlockingClient(f"ws://127.0.0.1:{node.port}") as other:
            with other.lock("B"):  # a reindex elsewhere: this one gives up after 2 s
                assert requests.post(f"{base}/reindex", timeout=10).status_code == 409
        answers = []

        def reindex() -> None:
            answers.append(requests.post(f"{base}/reindex", timeout=10).json())

        callers = [threading.Thread(target=reindex) for _ in range(2)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(TIMEOUT)
        tokens = sorted(answer["fencing_token"] for answer in answers)
        assert len(tokens) == 2 and tokens[0] < tokens[1]  # one after the other
    finally:
        app.terminate()
        app.wait(10)


def _answers(base: str) -> bool:
    try:
        return requests.get(f"{base}/search", params={"q": ""}, timeout=1).status_code == 200
    except requests.ConnectionError:
        return False
