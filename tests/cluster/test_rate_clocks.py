"""Exact-mode keys handed over between owners whose clocks agree on nothing but their rates
(`cluster/rate_limits.py`, docs/cluster.md "Rate limits in exact mode"): offsets of hours, rates
2% apart either way, time in flight. Whatever the admissions of both owners, counted in real
time, they keep the rule as the node that decided each one counts it.

Each node's clock is `offset + rate x real time`, a monotonic clock as `node/clock.py` gives it.
`received` is the one conversion of an instant between clocks: the tests that end this module
make it wrong, on purpose, and see the checks fail."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.cluster import rate_algorithms
from sluicegate.cluster.rate_limits import RateLimiterConfig, RateLimits
from sluicegate.cluster.ring import rate_key
from sluicegate.cluster.slots import DRIFT, DRIFT_RATIO, Ballot, slot_of

CONFIGS = {
    "log": RateLimiterConfig("sliding_log", 3, window=1.0),
    "bucket": RateLimiterConfig("token_bucket", 4, rate=2.0),
    "gcra": RateLimiterConfig("gcra", 4, rate=2.0),
    "fixed": RateLimiterConfig("fixed_window", 3, window=1.0),
}
KEY = "k"
OLD, NEW = Ballot(7, 1, "n1"), Ballot(7, 2, "n2")
HOURS = 3600.0


@dataclass(frozen=True)
class NodeClock:
    """A node's monotonic clock: what it reads at a moment of real time."""

    name: str
    offset: float
    rate: float

    def at(self, real: float) -> float:
        return self.offset + self.rate * real


@dataclass(frozen=True)
class Go:
    real: float
    clock: NodeClock


def hand_over(
    limiter: str,
    sender: NodeClock,
    receiver: NodeClock,
    before: list[float],
    sent: float,
    flight: float,
    after: list[float],
) -> list[Go]:
    """The sender decides a check at each real time of `before`, resigns the key's slot at
    `sent`, its hand-over arrives `flight` later, and the receiver, which takes the slot then,
    decides a check at each real time of `after`: what went, and where."""
    old, new = RateLimits(CONFIGS, "n1"), RateLimits(CONFIGS, "n2")
    slot = slot_of(rate_key(limiter, KEY))
    went = [Go(real, sender) for real in before if old.check(limiter, KEY, 1, sender.at(real)).go]
    handover = old.lose_slot(slot, OLD, resigned=True, now=sender.at(sent))
    assert handover is not None
    arrived = receiver.at(sent + flight)
    new.handed_over(handover, arrived)
    new.gain_slot(slot, arrived, NEW, previous=OLD)
    went += [
        Go(real, receiver) for real in after if new.check(limiter, KEY, 1, receiver.at(real)).go
    ]
    return went


def beyond_the_rule(limiter: str, went: list[Go], sender: NodeClock, sent: float) -> str | None:
    """How `went` breaks the rule of `limiter` in real time, if it does, given that each node
    counts on its own clock (a clock 2% fast refills 2% faster, as it does on one node)."""
    config = CONFIGS[limiter]
    went = sorted(went, key=lambda go: go.real)
    if limiter == "log":
        # Any limit + 1 in a row span more than a window of the clock that decided the last.
        for first, last in zip(went, went[config.limit :], strict=False):
            if last.real - first.real <= config.window / last.clock.rate:
                return f"{config.limit + 1} went from {first.real} to {last.real}"
    elif limiter in ("bucket", "gcra"):
        rate = config.rate * max(go.clock.rate for go in went) if went else 0.0
        for i, first in enumerate(went):
            for count, last in enumerate(went[i:], start=1):
                if count > config.limit + rate * (last.real - first.real) + 1e-9:
                    return f"{count} went from {first.real} to {last.real}"
    else:
        # At most the limit in any window of one clock; and the sender's window the key was in
        # when it went, counted in real time to its end, holds at most the limit, whatever the
        # receiver admitted in it. (A window the sender admitted nothing in is not the key's:
        # the receiver's windows of a key it holds no state of are its own.)
        windows: dict[tuple[str, int], int] = {}
        for go in went:
            index = (go.clock.name, math.floor(go.clock.at(go.real) / config.window))
            windows[index] = windows.get(index, 0) + 1
        if max(windows.values(), default=0) > config.limit:
            return f"{max(windows.values())} in one window"
        start = math.floor(sender.at(sent) / config.window) * config.window
        real_start = (start - sender.offset) / sender.rate
        real_end = (start + config.window - sender.offset) / sender.rate
        inside = sum(1 for go in went if real_start <= go.real < real_end)
        sender_went = any(go.clock is sender and real_start <= go.real for go in went)
        if sender_went and inside > config.limit:
            return f"{inside} in the sender's last window, {real_start} to {real_end}"
    return None


def test_a_sliding_log_handed_to_a_clock_half_a_second_ahead_does_not_refill_early():
    """The adversary's run: 3 a second went at 0 to 0.04 s, and 3 more from 0.5 s at the new
    owner, whose clock reads 0.5 s more: 6 in 0.54 s, when times of day crossed."""
    sender, receiver = NodeClock("n1", 1000.0, 1.0), NodeClock("n2", 1000.5, 1.0)
    went = hand_over("log", sender, receiver, [0.0, 0.02, 0.04], 0.05, 0.01, [0.5, 0.52, 0.54])
    assert [go.real for go in went] == [0.0, 0.02, 0.04]
    went = hand_over("log", sender, receiver, [0.0, 0.02, 0.04], 0.05, 0.01, [1.07, 1.08])
    assert [go.real for go in went] == [0.0, 0.02, 0.04, 1.07, 1.08]  # a window on: they go


@pytest.mark.parametrize("limiter", CONFIGS)
@pytest.mark.parametrize("ahead", [-5 * HOURS, -0.5, 0.5, 5 * HOURS])
def test_a_key_spent_just_before_its_hand_over_stays_spent_on_any_clock(limiter, ahead):
    """Spent at the sender, handed over at once: the receiver, hours or half a second ahead or
    behind, admits nothing before the rule lets it, and then what the rule lets it."""
    sender = NodeClock("n1", 50_000.0, 1.02)
    receiver = NodeClock("n2", 50_000.0 + ahead, 0.98)
    before = [0.0, 0.01, 0.02, 0.03]
    after = [0.05 + 0.05 * i for i in range(60)]
    went = hand_over(limiter, sender, receiver, before, 0.04, 0.001, after)
    assert beyond_the_rule(limiter, went, sender, 0.04) is None
    assert any(go.clock is receiver for go in went)  # not spent for ever either


clocks = st.builds(
    NodeClock,
    st.just("n1"),
    st.integers(-10, 10).map(lambda hours: 100_000.0 + hours * HOURS),
    st.sampled_from([1 - DRIFT, 1.0, 1 + DRIFT]),
)
gaps = st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.25, 0.4]), max_size=25)


def _times(start: float, steps: list[float]) -> list[float]:
    times, now = [], start
    for step in steps:
        now += step
        times.append(now)
    return times


@pytest.mark.parametrize("limiter", CONFIGS)
@settings(max_examples=200, deadline=None)
@given(
    sender=clocks,
    receiver=clocks.map(lambda clock: NodeClock("n2", clock.offset + 0.3, clock.rate)),
    before=gaps,
    wait=st.sampled_from([0.0, 0.02, 0.3, 0.7]),
    flight=st.sampled_from([0.0, 0.001, 0.04, 0.3]),
    after=gaps,
)
def test_a_hand_over_keeps_the_rule_in_real_time(
    limiter, sender, receiver, before, wait, flight, after
):
    before_times = _times(0.0, before)
    sent = (before_times[-1] if before_times else 0.0) + wait
    after_times = _times(sent + flight, after)
    went = hand_over(limiter, sender, receiver, before_times, sent, flight, after_times)
    assert beyond_the_rule(limiter, went, sender, sent) is None


# -- the checks fail when the conversion is wrong --------------------------------------------


def _earlier(offset: float, ratio: float = DRIFT_RATIO) -> float:
    """The wrong direction: the future shrunk, the past stretched."""
    return offset / ratio if offset > 0 else offset * ratio


@pytest.mark.parametrize(
    ("limiter", "wrong", "sender_rate", "receiver_rate", "ahead"),
    [
        ("log", "time of day", 1.0, 1.0, 0.5),
        ("bucket", "time of day", 1.0, 1.0, 0.5),
        ("gcra", "time of day", 1.0, 1.0, 0.5),
        ("log", "earlier", 1 + DRIFT, 1 - DRIFT, 0.5),
        ("gcra", "earlier", 1 - DRIFT, 1 + DRIFT, 0.5),
        # A window's end placed early is saved by the receiver's window that holds it, unless
        # one of the receiver's windows ends between the two: its clock reads 102 at 1.0 s.
        ("fixed", "earlier", 1 - DRIFT, 1 + DRIFT, 0.98),
    ],
)
def test_each_wrong_conversion_breaks_the_rule(
    monkeypatch, limiter, wrong, sender_rate, receiver_rate, ahead
):
    """The checks above have teeth. "time of day": the receiver reads the sender's times as its
    own, as it did when hand-overs carried them (its clock `ahead` of the sender's, at one
    rate, and the hand-over takes no time). "earlier": it places them earlier, not later."""

    def as_the_time_of_day(offset: float, ratio: float = 1.0) -> float:
        return offset - ahead

    conversion = as_the_time_of_day if wrong == "time of day" else _earlier
    monkeypatch.setattr(rate_algorithms, "received", conversion)
    sender = NodeClock("n1", 100.0, sender_rate)
    receiver = NodeClock("n2", 100.0 + ahead, receiver_rate)
    broken = []
    for start in range(0, 100):
        before = [start * 0.01 + i * 0.001 for i in range(4)]
        for wait in (0.0, 0.3, 0.9):
            sent = before[-1] + wait
            after = [sent + 0.001 * i for i in range(1, 1200, 7)]
            went = hand_over(limiter, sender, receiver, before, sent, 0.0, after)
            broken.append(beyond_the_rule(limiter, went, sender, sent))
    assert any(broken)
