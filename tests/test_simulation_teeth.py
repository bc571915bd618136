"""The checkers have teeth: each realistic bug of `simulations/planted.py`, planted in the node's
code, is caught within a few seeds that pass without it (the seeds still open are left out:
they fail anyway)."""

from __future__ import annotations

import re

import pytest

from simulations.planted import PLANTED

from .test_simulations import failed_seeds, simulate

BUDGET = 30  # seeds tried per planted bug, at most


@pytest.fixture(scope="module")
def seeds_file(tmp_path_factory):
    """The first `BUDGET` seeds (each passes without a planted bug)."""
    seeds = range(BUDGET)
    path = tmp_path_factory.mktemp("teeth") / "seeds.txt"
    path.write_text("\n".join(map(str, seeds)) + "\n")
    return path


def test_without_a_planted_bug_those_seeds_pass(seeds_file):
    done = simulate("--seeds-from", str(seeds_file), timeout=600)
    assert done.returncode == 0, done.stdout


# What each planted bug must show as: the checker that is to catch it.
CAUGHT_AS = {
    "fencing-counter-stays-on-takeover": r": token \d+ on A",
    "grace-period-ignored": r"held \d+ > max",
    "expiry-early": r"held \d+ > max",
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_is_caught(bug, seeds_file):
    done = simulate("--seeds-from", str(seeds_file), "--plant", bug, "--until-caught", timeout=600)
    assert done.returncode == 1, f"{bug} not caught in {BUDGET} seeds\n{done.stdout}"
    assert len(failed_seeds(done.stdout)) == 1
    assert re.search(CAUGHT_AS[bug], done.stdout), done.stdout
    print(done.stdout)
