"""The simulated cluster (`simulations/`): a run replays the same from its seed, in this process
and in another; the seeds that ever failed are replayed."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from simulations.run import read_seeds, regressions, run_options
from tests.simulations.runs import ROOT, SIMULATIONS, Run, background, background_group

# As many seeds as keep `make test` within 15 minutes here (2 cores).
SEEDS = 32
# Seeds swept with five nodes too (minority and majority splits).
SEEDS_OF_FIVE = 10
# Seeds of that sweep run again in another process: the same trace hashes.
REPLAYED = 5
# Seeds that fail, found by the simulations and not fixed yet. The sweep and the regression
# replay must fail exactly these: a new failure, or a fix, shows; a seed that fails goes here,
# diagnosed in simulations/regressions*.txt, until it is fixed.
OPEN: set[int] = set()


EXTRA_KINDS = ("--seed", "18", "--with", "skew,freeze", "--availability", "--trace", "--hashes")
LATE_REPEATS = ("--seed", "8", "--with", "overlap", "--hashes")

sweep = background("sweep", Run(("--hashes",), seeds=tuple(range(SEEDS)), jobs=2))
five_node_sweep = background(
    "five_node_sweep", Run(("--nodes", "5"), seeds=tuple(range(SEEDS_OF_FIVE)), jobs=2)
)
replayed = background(
    "replayed",
    Run(
        ("--hashes",),
        seeds=tuple(range(0, SEEDS, SEEDS // REPLAYED))[:REPLAYED],
        jobs=2,
        hash_seed=12345,
    ),
)
# The seeds of regressions.txt below the sweep's run in it; the others run in `make deep`
# (`python -m simulations replay`): the workload and the rules have changed since most were
# found, so they run other histories now, as any seeds would. The newer files are replayed here.
REPLAYED_HERE = [group for group in regressions() if group.source != "regressions.txt"]


regressions_replayed = background_group(
    "regressions_replayed",
    {
        group.source: Run(
            (*run_options(group.nodes, group.extra, group.availability), "--hashes"),
            group.seeds,
            jobs=2,
        )
        for group in REPLAYED_HERE
    },
)
# Each run twice, under two hash seeds.
extra_kinds = background_group(
    "extra_kinds", {"first": Run(EXTRA_KINDS), "again": Run(EXTRA_KINDS, hash_seed=5)}
)
late_repeats = background_group(
    "late_repeats", {"first": Run(LATE_REPEATS), "again": Run(LATE_REPEATS, hash_seed=5)}
)
# Asking for the extra kinds adds them to a seed's choice, from a random source of their own:
# a seed that enables neither (seed 8, here) runs as it does without them.
without_extra_kinds = background(
    "without_extra_kinds", Run(("--seed", "8", "--with", "skew,freeze", "--hashes"))
)


def hashes(output: str) -> dict[int, str]:
    return {int(seed): h for seed, h in re.findall(r"seed (\d+) hash (\w+)", output)}


# Two runs of a seed in one process, then a run of another seed: trace hashes, operations.
IN_ONE_PROCESS = """
from simulations.run import run_seed
first, second, other = run_seed(3), run_seed(3), run_seed(4)
print(first.trace_hash, second.trace_hash, first.trace == second.trace, first.operations)
print(other.trace_hash)
"""


def test_a_seed_replays_the_same_in_one_process_and_in_another(sweep):
    # Each in a process of its own: trio's deterministic scheduling draws from one random
    # source per process, which a trio loop in another thread (a blocking client's, left by
    # an earlier test) would draw from too.
    done = subprocess.run(
        [sys.executable, "-c", IN_ONE_PROCESS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONHASHSEED": "1"},
    )
    (first, second, same_trace, operations), (other,) = (
        line.split() for line in done.stdout.splitlines()
    )
    assert first == second and same_trace == "True"
    assert int(operations) > 100
    assert other != first
    # The sweep's process, under another hash seed: nothing in a run depends on hash order.
    assert hashes(sweep.stdout)[3] == first


def failed_seeds(output: str) -> set[int]:
    return {int(seed) for seed in re.findall(r"^seed (\d+) \(trace", output, re.M)}


def test_every_seed_of_the_sweep_keeps_every_promise_but_the_open_ones(sweep):
    assert re.search(rf"runs\s+{SEEDS} ", sweep.stdout), sweep.stderr[-2000:]
    assert failed_seeds(sweep.stdout) == OPEN & set(range(SEEDS)), sweep.stdout


def test_every_seed_of_five_nodes_keeps_every_promise(five_node_sweep):
    done = five_node_sweep
    assert re.search(rf"runs\s+{SEEDS_OF_FIVE} ", done.stdout), done.stderr[-2000:]
    assert re.search(r"faults .*split \d+", done.stdout), done.stdout
    assert failed_seeds(done.stdout) == set(), done.stdout


def test_seeds_of_the_sweep_replay_to_the_same_trace_hashes(sweep, replayed):
    """In another process, under another hash seed than the sweep's."""
    swept = hashes(sweep.stdout)
    assert len(swept) == SEEDS
    again = hashes(replayed.stdout)
    assert len(again) == REPLAYED
    assert again == {seed: swept[seed] for seed in again}


def test_every_file_of_seeds_that_failed_once_is_replayed_whole():
    """By `make deep` (`replay`): every seed line of every simulations/regressions*.txt."""
    listed = {
        (path.name, seed)
        for path in SIMULATIONS.glob("regressions*.txt")
        for seed in read_seeds(path)
    }
    grouped = [
        (group.source.split(",")[0], seed) for group in regressions() for seed in group.seeds
    ]
    assert sorted(grouped) == sorted(listed)
    below = [seed for seed in read_seeds(SIMULATIONS / "regressions.txt") if seed < SEEDS]
    assert below, "the sweep runs some of regressions.txt"


def test_seeds_that_once_failed_pass_as_they_ran(regressions_replayed):
    """Those of the files but regressions.txt, with the nodes, kinds and probe each gives."""
    assert sorted(regressions_replayed) == sorted(group.source for group in REPLAYED_HERE)
    for group in REPLAYED_HERE:
        done = regressions_replayed[group.source]
        assert len(hashes(done.stdout)) == len(group.seeds), done.stderr[-2000:]
        assert failed_seeds(done.stdout) == OPEN & set(group.seeds), done.stdout


def test_the_extra_kinds_skew_a_clock_and_freeze_a_node_mid_write_and_replay_the_same(
    extra_kinds,
):
    # Seed 18 enables both (and both fire); the availability probe reports the freeze.
    done = extra_kinds["first"]
    assert "clock of n3 runs at 1.01 (skew)" in done.stdout, done.stdout[-2000:]
    assert re.search(r"n\d frozen mid-write: \d+ of \d+ bytes to \w+ went", done.stdout)
    assert re.search(r"^faults .*freeze 1.*skew 1", done.stdout, re.M)
    assert re.search(r"^  freeze +1 +[\d.]+", done.stdout, re.M)
    assert hashes(extra_kinds["again"].stdout) == hashes(done.stdout) != {}


def test_overlap_bursts_send_some_second_copies_late_and_replay_the_same(late_repeats):
    # Seed 8's burst repeats messages; half the second copies go later (SimNetwork.late_repeat).
    done = late_repeats["first"]
    assert re.search(r"^faults .*overlap:duplicate 1", done.stdout, re.M), done.stdout[-2000:]
    late = re.search(r"messages repeated late (\d+)", done.stdout)
    assert late and int(late[1]) > 0, done.stdout[-2000:]
    assert failed_seeds(done.stdout) == set(), done.stdout[-2000:]
    assert hashes(late_repeats["again"].stdout) == hashes(done.stdout) != {}


def test_without_extra_kinds_a_seed_keeps_its_history(sweep, without_extra_kinds):
    assert hashes(without_extra_kinds.stdout) == {8: hashes(sweep.stdout)[8]}


def test_a_deep_sweep_prints_its_first_seed_and_how_to_run_it_again():
    done = subprocess.run(
        [sys.executable, "-m", "simulations", "deep", "--three", "1", "--five", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    first = int(re.match(r"deep: seeds (\d+) to ", done.stdout).group(1))
    assert 10**7 <= first < 10**9
    assert f"again: python -m simulations deep --first {first} --three 1 --five 1" in done.stdout
    assert re.search(r"^3 nodes, 1 seeds from", done.stdout, re.M)
    assert re.search(r"^5 nodes, 1 seeds from", done.stdout, re.M)
    assert "unavailable seconds after each fault began" in done.stdout
    assert done.returncode == (0 if "deep: 0 of 2 seeds failed" in done.stdout else 1)
