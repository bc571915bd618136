"""Fixtures every folder shares (a node process, the anyio backends), and the start of the
long simulation runs once the tests are collected (tests/simulations/runs.py)."""

import sys

import pytest

from .nodes import NodeProcess

# The configuration most process tests use: Throttle's README semaphores plus odd names.
NODE_CONFIG = """
[semaphores]
A = 1
B = { max = 1, level = 1 }
C = 5
"a/b&c%" = 2
"ünï code" = 1
"""


@pytest.fixture
def node(tmp_path):
    """A fresh node process per test."""
    with NodeProcess(NODE_CONFIG, workdir=tmp_path) as process:
        yield process


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory):
    """One node process for a whole module of tests that do not disturb each other."""
    with NodeProcess(NODE_CONFIG, workdir=tmp_path_factory.mktemp("node")) as process:
        yield process


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request) -> str:
    """Tests marked `anyio` (the client's) run under asyncio and under trio."""
    return request.param


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """Tests marked `anyio` run on the backends of their `anyio_backend` (anyio's plugin), not
    under pytest-trio, whose trio mode takes every async test."""
    for item in items:
        if item.get_closest_marker("anyio") is not None:
            item.own_markers[:] = [mark for mark in item.own_markers if mark.name != "trio"]


def pytest_collection_finish(session):
    """Start the long simulation runs the collected tests wait for (tests/simulations/runs.py)."""
    if session.config.option.collectonly:
        return
    runs = sys.modules.get("tests.simulations.runs")
    if runs is not None:
        runs.RUNS.start(runs.RUNS.named({n for item in session.items for n in item.fixturenames}))


def pytest_sessionfinish(session):
    runs = sys.modules.get("tests.simulations.runs")
    if runs is not None:
        runs.RUNS.stop()
