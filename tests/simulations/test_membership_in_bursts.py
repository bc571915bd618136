"""The members change inside overlap bursts (simulations/faults.py, `Injector._change_members`):
on a seed of `run --with overlap` each change really happens while the burst's faults go on,
the trace shows it in its order, and the run keeps every promise. And the rules that keep a
burst within docs/cluster.md's argument: no other member crashes beside a departure, and a
joiner counts as faulty until it serves."""

from __future__ import annotations

import random
import re
import subprocess
from types import SimpleNamespace

import pytest

from simulations.faults import Injector
from simulations.history import History
from tests.simulations.runs import Run, background_group

# A three-node seed of `run --seed N --with overlap` (within make test's sweep) whose
# bursts make each change. Seed 15's second burst also puts off the faulty member's crash and
# slow link until the joiner serves.
SEEDS = {"leave": 31, "forget": 15, "join": 15}
BURSTS = ("--with", "overlap", "--trace")
FIRST_MEMBERS = {"n1", "n2", "n3"}
EVENT = re.compile(r"^\s*(\d+\.\d+) (\w+)\s+(\S+)\s*(.*)$")


bursts = background_group(
    "bursts",
    {
        str(seed): Run(("--seed", str(seed), "--with", "overlap", "--trace"))
        for seed in SEEDS.values()
    },
)


@pytest.fixture(scope="module")
def runs(bursts) -> dict[str, subprocess.CompletedProcess]:
    """Each change's seed, run once with its trace."""
    return {change: bursts[str(seed)] for change, seed in SEEDS.items()}


class Trace:
    """A run's events in order, (time, kind, who, detail), and a cursor past the last found."""

    def __init__(self, done: subprocess.CompletedProcess, fired: str) -> None:
        assert done.returncode == 0, done.stdout
        assert "violations  0 in 0 runs" in done.stdout, done.stdout
        assert re.search(rf"^faults .*\b{fired} [1-9]", done.stdout, re.M), done.stdout
        self.events = [m.groups() for m in map(EVENT.match, done.stdout.splitlines()) if m]
        self.at = 0

    def next(self, kind: str, who: str = "-", detail: str = "") -> re.Match:
        """The next event of `kind` by `who` whose detail matches `detail`."""
        for index in range(self.at, len(self.events)):
            _, event_kind, event_who, event_detail = self.events[index]
            found = re.fullmatch(detail, event_detail)
            if event_kind == kind and event_who == who and found:
                self.at = index + 1
                return found
        raise AssertionError(f"no {kind} {who} {detail!r} after event {self.at}")

    def since(self, start: int) -> set[tuple[str, str]]:
        """(kind, who) of the events from `start` up to the cursor."""
        return {(kind, who) for _, kind, who, _ in self.events[start : self.at]}

    def faulty_now(self) -> list[str]:
        """The faulty members of the burst the cursor is in."""
        for _, kind, _, detail in reversed(self.events[: self.at]):
            assert (kind, detail) != ("note", "burst healed"), "not in a burst"
            if kind == "note" and detail.startswith("overlapping faults on "):
                return detail.removeprefix("overlapping faults on ").split(", ")
        raise AssertionError("not in a burst")

    def whole_after_the_heal(self) -> None:
        """The burst healed, then every member served and counted every member's current
        life (`_Cluster.whole`)."""
        self.next("note", detail="burst healed")
        self.next("whole")


def test_a_faulty_member_leaves_gracefully_mid_burst_and_comes_back_a_member(runs):
    trace = Trace(runs["leave"], "overlap:leave")
    member = trace.next("note", detail=r"(n[123]) leaves").group(1)
    assert member in trace.faulty_now()
    trace.next("down", member, "left")
    trace.next("up", member)  # its next life, later in the burst or at the heal
    trace.whole_after_the_heal()


def test_a_crashed_member_is_forgotten_by_a_live_one_and_its_next_life_is_a_member(runs):
    trace = Trace(runs["forget"], "overlap:forget")
    pattern = r"(n\d) crashed, for good as far as the operator knows"
    member = trace.next("note", detail=pattern).group(1)
    faulty = trace.faulty_now()
    assert member in faulty
    crashed = trace.at
    asker = trace.next("note", detail=rf"(n\d) forgot {member}").group(1)
    assert asker not in faulty
    assert ("up", member) not in trace.since(crashed), "forgotten while down, not after"
    trace.next("up", member)
    trace.whole_after_the_heal()  # its new life counted by all


def test_a_new_member_joins_mid_burst_and_leaves_at_the_heal(runs):
    trace = Trace(runs["join"], "overlap:join")
    joiner = trace.next("note", detail=r"(n\d+) joins").group(1)
    assert joiner not in FIRST_MEMBERS
    trace.faulty_now()  # it joined within a burst
    trace.next("up", joiner)
    trace.next("note", detail=f"{joiner} leaves")
    trace.next("down", joiner, "left")
    trace.whole_after_the_heal()  # whole without it: nobody counts it any more


def injector(nodes: int) -> Injector:
    cluster = SimpleNamespace(network=None, ids=[f"n{i}" for i in range(1, nodes + 1)], nodes={})
    return Injector(cluster, [], History(), ["overlap"], random.Random(0), 4.0, restart=None)


def test_beside_a_departure_only_the_departing_members_own_crash_goes():
    faults = injector(5)
    rng = random.Random(0)
    plans = [
        (faults._crash_in_burst, ("n1",), rng),
        (faults._crash_in_burst, ("n2",), rng),
        (faults._links_in_burst, ("n1", "slow"), rng),
    ]
    assert faults._beside_a_departure(plans, "n1") == plans[1:]


def test_a_joiner_takes_the_place_of_one_faulty_member_until_it_serves():
    rng = random.Random(0)
    for nodes, alongside in ((3, set()), (5, {"n1"})):
        faults = injector(nodes)
        plans = [
            (faults._crash_in_burst, ("n1",), rng),
            (faults._links_in_burst, ("n2", "cut"), rng),
        ]
        beside = faults._beside_a_join(plans, ["n1", "n2"], f"n{nodes + 1}")
        at_once = {args[0] for act, args, _ in beside if act != faults._once_joined}
        assert at_once == alongside
        assert all(
            args[0] == f"n{nodes + 1}" for act, args, _ in beside if act == faults._once_joined
        )
