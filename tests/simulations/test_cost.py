"""`python -m simulations cost` (simulations/cost.py): what a lock cycle costs the cluster, as
docs/benchmarks.md explains it. Each quorum write goes to every other member and is answered,
and it commits (a round trip) before what follows it goes on; a client at another member than
the owner adds a forward and its answer to the acquire and to the release, and a LockTaken."""

from __future__ import annotations

import re

from tests.simulations.runs import Run, background

cost = background("cost", Run(("--nodes", "3"), command="cost"))
# Nodes, client at, messages, frames, bytes, writes, one-way delays, task steps.
ROW = re.compile(
    r"^ +(\d+)  (the owner|another member) +([\d.]+) +([\d.]+) +(\d+) +([\d.]+) +([\d.]+)"
    r" +([\d.]+)$"
)
# Two by the peer's home (the acquire's ticket, the release), two by the semaphore's owner (the
# grant, the release); five until the home stopped writing grants (docs/cluster.md).
MOST_WRITES = 4


def rows(output: str) -> list[tuple[int, bool, float, float, float]]:
    """(nodes, at another member, messages, writes, one-way delays) of each row."""
    found = [ROW.match(line) for line in output.splitlines()]
    return [
        (int(m[1]), m[2] == "another member", float(m[3]), float(m[6]), float(m[7]))
        for m in found
        if m
    ]


def test_every_size_and_place_is_measured(cost):
    assert cost.returncode == 0, cost.stderr[-2000:]
    assert {(nodes, other) for nodes, other, *_ in rows(cost.stdout)} == {
        (3, False),
        (3, True),
    }, cost.stdout


def test_each_write_goes_to_every_other_member_and_is_answered(cost):
    for nodes, other, messages, writes, _ in rows(cost.stdout):
        assert 1 <= writes <= MOST_WRITES, cost.stdout
        forwards = 5 if other else 0
        assert abs(messages - (2 * writes * (nodes - 1) + forwards)) < 0.5, cost.stdout


def test_each_write_and_each_forward_is_a_round_trip_on_the_cycles_path(cost):
    for _, other, _, writes, delays in rows(cost.stdout):
        # The client's acquire and release, and their answers: four one-way delays. The home's
        # write of the acquire's ticket goes alongside its request, off the path.
        assert delays == 4 + 2 * (writes - 1) + (4 if other else 0), cost.stdout
