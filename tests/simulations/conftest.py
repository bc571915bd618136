"""Each long simulation run as a fixture: its output, once finished (tests/simulations/runs.py)."""

import subprocess

import pytest

from tests.simulations.runs import RUNS, run_args


def _run(name: str):
    @pytest.fixture(scope="session", name=name)
    def finished() -> subprocess.CompletedProcess:
        return RUNS.result(name)

    return finished


sweep = _run("sweep")
five_node_sweep = _run("five_node_sweep")
regressions = _run("regressions")
skew_regressions = _run("skew_regressions")
five_node_regressions = _run("five_node_regressions")


@pytest.fixture(scope="session")
def deep_regressions() -> dict[str, subprocess.CompletedProcess]:
    """regressions-deep.txt's runs by their number of nodes."""
    prefix = "deep_regressions_"
    return {
        name.removeprefix(prefix): RUNS.result(name)
        for name in run_args()
        if name.startswith(prefix)
    }
