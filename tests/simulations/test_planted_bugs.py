"""The checkers have teeth: each realistic bug of `simulations/planted.py`, planted in the node's
code, is caught on a seed that passes without it, within the seeds `make test` sweeps
(`python -m simulations run --seeds-from FILE --plant BUG --until-caught` over the passing ones
stops at the one named here, or earlier)."""

from __future__ import annotations

import re

import pytest

from simulations.planted import PLANTED
from tests.simulations.runs import Run, background, background_group
from tests.simulations.test_sweeps import OPEN, SEEDS, failed_seeds

PASSING = [seed for seed in range(SEEDS) if seed not in OPEN]

# Each planted bug: the seed that catches it, and what the checker that is to catch it says.
CAUGHT = {
    "lease-overrun": (3, r"\[max\] [\d.]+: \w held \d+ > max \d+"),
    "tokens-restart-on-takeover": (1, r"\[tokens\] [\d.]+: token \d+ on A"),
    "adopt-any-copy": (
        1,
        r"\[o2\] [\d.]+: slot \d+ gained by n\d \(life \d+, ballot \d+\) without version \d+",
    ),
    "expiry-early": (24, r"\[max\] [\d.]+: \w held \d+ > max \d+"),
    "gossip-merged-by-sum": (2, r"\[rate-gossip\] [\d.]+: n\d counted \d+ go event\(s\) of n\d"),
    "fifo-skipped-for-small-counts": (1, r"\[fifo\] [\d.]+: B 1 granted to \S+ \(asked"),
    "duplicated-grant-on-retry": (1, r"\[liveness\] [\d.]+: \w: remainder \d of \d"),
    "rate-retry-decided-again": (2, r"\[once\] [\d.]+: c\d's \w+ of \w+ 'k\d' went at n\d"),
    "leased-keys-start-whole": (2, r"\[rate-lease\] [\d.]+: leased 'k\d' admitted \d+ from"),
    "tokens-shared-by-concurrent-holders": (
        0,
        r"\[tokens\] [\d.]+: token \d+ on B to \S+, and to \S+ before",
    ),
    "adopt-latest-ballot-any-version": (
        1,
        r"\[o2\] [\d.]+: slot \d+ gained by n\d \(life \d+, ballot \d+\) without version \d+",
    ),
    "rate-limits-on-the-stepped-time-of-day": (
        0,
        r"\[rate-(window|gossip)\] [\d.]+: n\d \(life \d+\) admitted \d > \d of \w+ 'k\d' in one "
        r"window",
    ),
    "handover-window-by-the-senders-clock": (
        9,
        r"\[rate-handover\] [\d.]+: n\d's last window of exact 'k\d' before its hand-over",
    ),
}
# Bugs that show only where each node has a time of day of its own: their seeds run `--with
# wall` (which leaves the other kinds' choices as they are), with and without the bug.
WALL = {"rate-limits-on-the-stepped-time-of-day", "handover-window-by-the-senders-clock"}
# Bugs only the checkers that see beyond A and the clients catch: on their seed, every violation
# is of that checker (and the tokens of A stay right).
NEW_CHECKERS_ONLY = {
    "tokens-shared-by-concurrent-holders": "tokens",
    "adopt-latest-ballot-any-version": "o2",
    "handover-window-by-the-senders-clock": "rate-handover",
}


def kinds(bug: str) -> tuple[str, ...]:
    return ("--with", "wall") if bug in WALL else ()


planted = background_group(
    "planted",
    {
        bug: Run(("--seed", str(seed), "--plant", bug, *kinds(bug)))
        for bug, (seed, _) in CAUGHT.items()
    },
)
# (The others are seeds of the sweep, which must pass: tests/simulations/test_sweeps.py.)
wall_seeds_without_bugs = background(
    "wall_seeds_without_bugs",
    Run(("--with", "wall"), seeds=tuple(sorted({CAUGHT[bug][0] for bug in WALL})), jobs=2),
)


def test_every_planted_bug_has_a_seed_within_the_budget():
    assert set(CAUGHT) == set(PLANTED)
    assert all(seed in PASSING for seed, _ in CAUGHT.values())


def test_without_a_planted_bug_those_seeds_pass_with_wall(wall_seeds_without_bugs):
    done = wall_seeds_without_bugs
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_is_caught(bug, planted):
    seed, caught_as = CAUGHT[bug]
    done = planted[bug]
    assert done.returncode == 1, f"{bug} not caught on seed {seed}\n{done.stdout}"
    assert failed_seeds(done.stdout) == {seed}
    assert re.search(caught_as, done.stdout), done.stdout
    print(done.stdout)


@pytest.mark.parametrize("bug", sorted(NEW_CHECKERS_ONLY))
def test_a_bug_only_the_new_checkers_see(bug, planted):
    done = planted[bug]
    tally = re.search(r"^by checker  (.*)$", done.stdout, re.M)
    assert tally is not None, done.stdout
    assert re.fullmatch(rf"{NEW_CHECKERS_ONLY[bug]} \d+", tally.group(1)), done.stdout
    assert not re.search(r"\[tokens\] [\d.]+: token \d+ on A", done.stdout), done.stdout
