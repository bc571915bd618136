"""The client's slices of lease-mode keys (client/slices.py), sans-IO: what a check spends, when
the next slice is asked for, what an ask reports and wants."""

from __future__ import annotations

import pytest

from sluicegate.client.slices import FIRST_WANT, KeySlices
from sluicegate.cluster.quota_leases import holder_term


def granted(slices: KeySlices, now: float, slice_id: int, tokens: int, term: float = 1.0) -> None:
    slices.ask(now)
    slices.granted(slice_id, tokens, term, 0.0, now)


def test_a_slice_is_spent_until_its_end_counted_from_when_it_was_asked_for():
    slices = KeySlices()
    assert slices.due(0.0) and slices.spend(1, 0.0) is None
    ask = slices.ask(0.0, n=3)
    assert ask.reports == [] and ask.want == FIRST_WANT and not slices.due(0.0)
    slices.granted(1, 10, 1.0, 0.0, now=0.2)  # the answer took 0.2 s
    assert slices.spend(3, 0.2) == 7
    assert slices.spend(8, 0.2) is None  # one slice serves a check whole, or not at all
    ends = holder_term(1.0)
    assert slices.spend(1, ends - 0.01) == 6
    assert slices.spend(1, ends) is None  # over, by its end from the ask at 0.0


def test_the_next_slice_is_asked_for_half_spent_or_half_over():
    slices = KeySlices()
    granted(slices, 0.0, 1, 10)
    assert not slices.due(0.1)
    slices.spend(5, 0.1)
    assert slices.due(0.1)
    other = KeySlices()
    granted(other, 0.0, 1, 10)
    assert not other.due(0.49) and other.due(0.5)


def test_an_ask_reports_the_current_slice_then_closes_it_once_replaced():
    slices = KeySlices()
    granted(slices, 0.0, 1, 10)
    slices.spend(6, 0.1)
    ask = slices.ask(0.4)
    assert ask.reports == [[1, 6, False]]
    slices.spend(2, 0.45)  # still from slice 1 while the ask is on its way
    slices.granted(2, 12, 1.0, 0.0, now=0.5)
    assert slices.spend(1, 0.5) == 11  # from slice 2 now
    assert slices.ask(0.7).reports == [[1, 8, True], [2, 1, False]]
    slices.granted(3, 12, 1.0, 0.0, now=0.8)
    assert slices.ask(0.9).reports == [[2, 1, True], [3, 0, False]]


def test_a_report_that_got_no_answer_is_made_again():
    slices = KeySlices()
    granted(slices, 0.0, 1, 10)
    granted(slices, 0.5, 2, 10)
    assert slices.ask(0.6).reports[0] == [1, 0, True]
    slices.failed()
    assert slices.ask(0.7).reports[0] == [1, 0, True]


def test_after_the_owners_sorry_nothing_is_asked_until_its_retry_after():
    slices = KeySlices()
    slices.ask(0.0)
    slices.granted(0, 0, 0.0, retry_after=0.3, now=0.1)
    assert not slices.due(0.39) and slices.due(0.4)
    assert slices.not_before == pytest.approx(0.4)


def test_the_want_follows_the_rate_spent_with_headroom_and_at_most_doubles():
    slices = KeySlices()
    granted(slices, 0.0, 1, 100)
    slices.spend(20, 0.5)  # 40 a second: 60 a term with half again
    assert slices.ask(0.5).want == 60
    slices.granted(2, 10, 1.0, 0.0, now=0.5)
    slices.spend(10, 0.6)  # 100 a second, but a slice of 10: at most 2 x 10 + 1
    assert slices.ask(0.6).want == 21
    idle = KeySlices()
    granted(idle, 0.0, 1, 100)
    idle.spend(1, 0.5)
    assert idle.ask(0.5, n=4).want == 4  # at least the check that asks


def test_a_key_is_idle_once_nothing_is_held_or_to_report():
    slices = KeySlices()
    assert slices.idle(0.0)
    granted(slices, 0.0, 1, 10)
    assert not slices.idle(0.5)
    assert slices.closing_reports(0.5) == [[1, 0, True]]
    assert slices.idle(2.0)
