"""The simulated cluster (`simulations/`): a run replays the same from its seed, in this process
and in another; the seeds that ever failed are replayed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from simulations.run import read_seeds, run_seed

ROOT = Path(__file__).resolve().parent.parent
# As many seeds as fit in about three minutes here (2 cores, shared), in two processes.
SEEDS = 200
# Seeds of that sweep run again in another process, one at a time: the same trace hashes.
REPLAYED = 20
# Seeds of the sweep that fail, found by the simulations and not fixed yet. The sweep must fail
# exactly these: a new failure, or a fix, shows. What fails them (issue 6, third session; README's
# simulations section has the diagnosis of each class, with a seed to replay):
# * a lease lost while its client heartbeats, because a node stalled (paused) or the link to the
#   peer's home stalled (clogged): the client waits on the stalled node, the node on the stalled
#   link, longer than the peer's expiry (most of them);
# * an exact-mode rate limit beyond its limit across a partition: the cut-off owner decides until
#   it notices, its successor starts from a replica without those decisions, with no grace;
# * more than max held, or fencing tokens out of order: a forwarded release, or a grant, held up
#   on a stalled link and delivered late (the release drops the peer's next lock; the client
#   takes the grant after its peer may have expired); ghost locks from stale replicas; a
#   heartbeat missing from the replica a new home starts from;
# * leases lost after a partition heals, when an introduction and a dial cross and the two nodes
#   keep different connections (messages lost both ways until the next redial).
OPEN = {
    int(seed)
    for seed in """
3 4 6 7 13 17 18 21 22 25 26 27 30 36 37 42 45 46 47 50 51 52 53 57 66 69 74 77 79 85 86
89 93 96 100 106 110 111 112 116 117 118 119 120 123 125 126 130 132 135 142 144 147 148
150 152 155 156 158 160 164 169 175 179 180 181 184 188 189 195
""".split()
}


def simulate(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -m simulations run ...` in a new process (it runs under PYTHONHASHSEED=0)."""
    return subprocess.run(
        [sys.executable, "-m", "simulations", "run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def hashes(output: str) -> dict[int, str]:
    return {int(seed): h for seed, h in re.findall(r"seed (\d+) hash (\w+)", output)}


def test_a_seed_replays_the_same_in_this_process_and_in_another():
    first, second = run_seed(3), run_seed(3)
    assert first.trace_hash == second.trace_hash
    assert first.trace == second.trace
    assert first.operations > 100
    assert run_seed(4).trace_hash != first.trace_hash
    # Another process (under PYTHONHASHSEED=0, which this one may not have), twice.
    once = hashes(simulate("--seed", "3", "--hashes", timeout=120).stdout)
    again = hashes(simulate("--seed", "3", "--hashes", timeout=120).stdout)
    assert once and once == again


@pytest.fixture(scope="module")
def sweep() -> subprocess.CompletedProcess:
    return simulate("--seeds", str(SEEDS), "--jobs", "2", "--hashes", timeout=900)


def failed_seeds(output: str) -> set[int]:
    return {int(seed) for seed in re.findall(r"^seed (\d+) \(trace", output, re.M)}


def test_every_seed_of_the_sweep_keeps_every_promise_but_the_open_ones(sweep):
    assert re.search(rf"runs\s+{SEEDS} ", sweep.stdout), sweep.stderr[-2000:]
    assert failed_seeds(sweep.stdout) == OPEN, sweep.stdout


def test_seeds_of_the_sweep_replay_to_the_same_trace_hashes(sweep, tmp_path):
    swept = hashes(sweep.stdout)
    assert len(swept) == SEEDS
    chosen = [str(seed) for seed in range(0, SEEDS, SEEDS // REPLAYED)]
    listed = tmp_path / "replayed-seeds.txt"
    listed.write_text("\n".join(chosen) + "\n")
    again = simulate("--seeds-from", str(listed), "--hashes", timeout=600)
    replayed = hashes(again.stdout)
    assert len(replayed) == REPLAYED
    assert replayed == {seed: swept[seed] for seed in replayed}


def test_seeds_that_once_failed_pass():
    regressions = read_seeds(ROOT / "simulations" / "regressions.txt")
    done = simulate("--seeds-from", "simulations/regressions.txt", "--hashes", timeout=600)
    assert len(hashes(done.stdout)) == len(regressions)
    assert failed_seeds(done.stdout) == OPEN & set(regressions), done.stdout
