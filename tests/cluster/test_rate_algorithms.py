"""Each rate-limiting algorithm against its promise, over random request sequences.

Times are multiples of 1/64 s and rates powers of two, so every float here is exact and a
request on a boundary is tested on the boundary, not next to it.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.cluster.rate_algorithms import (
    FixedWindow,
    Gcra,
    SlidingLog,
    SlidingWindowCounter,
    TokenBucket,
)

TICK = 1 / 64

# A request: (ticks after the previous one, weight).
requests = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 4)), min_size=1, max_size=120)
limits = st.integers(1, 8)
rates = st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0])
windows = st.sampled_from([0.25, 0.5, 1.0, 2.0])


def run(algorithm, sequence, start=1000.0):
    """Feed `sequence` to one key; the admitted (time, weight) pairs and every decision."""
    now = start
    state = algorithm.new_state(now)
    admitted, decisions = [], []
    for gap, n in sequence:
        now += gap * TICK
        n = min(n, algorithm.max_weight)
        decision = algorithm.check(state, n, now)
        decisions.append((now, n, decision))
        if decision.go:
            admitted.append((now, n))
    return admitted, decisions


def keeps_its_rule(algorithm, admitted):
    """Assert that the admitted (time, weight) pairs of one key keep `algorithm`'s promise."""
    admitted = sorted(admitted)
    if isinstance(algorithm, SlidingLog):
        times = [at for at, n in admitted for _ in range(n)]
        for first, last in zip(times, times[algorithm.limit :], strict=False):
            assert last - first > algorithm.window
    elif isinstance(algorithm, TokenBucket | Gcra):
        capacity, rate = (
            (algorithm.capacity, algorithm.rate)
            if isinstance(algorithm, TokenBucket)
            else (algorithm.burst, algorithm.rate)
        )
        for i, (start, _) in enumerate(admitted):
            total = 0
            for at, n in admitted[i:]:
                total += n
                assert total <= capacity + rate * (at - start)
    else:
        limit, window = algorithm.limit, algorithm.window
        per_window: dict[int, int] = {}
        for at, n in admitted:
            index = math.floor(at / window)
            per_window[index] = per_window.get(index, 0) + n
        assert max(per_window.values(), default=0) <= limit
        if isinstance(algorithm, SlidingWindowCounter):
            # Its own rule, from the history: at each admission, the previous window's count
            # weighted by its overlap with the sliding window, plus the current window's.
            for at, _ in admitted:
                start = math.floor(at / window) * window
                current = sum(n for t, n in admitted if start <= t <= at)
                previous = sum(n for t, n in admitted if start - window <= t < start)
                assert previous * (1 - (at - start) / window) + current <= limit + 1e-9


@given(limits, windows, requests)
def test_the_sliding_log_never_admits_k_plus_1_within_its_window(k, tau, sequence):
    algorithm = SlidingLog(k, tau)
    keeps_its_rule(algorithm, run(algorithm, sequence)[0])


@given(limits, windows, requests)
def test_a_fixed_window_never_admits_more_than_its_limit_in_one_window(limit, window, sequence):
    algorithm = FixedWindow(limit, window)
    keeps_its_rule(algorithm, run(algorithm, sequence)[0])


@given(limits, rates, requests)
def test_a_token_bucket_never_admits_more_than_capacity_plus_rate_times_t(capacity, rate, seq):
    algorithm = TokenBucket(capacity, rate)
    keeps_its_rule(algorithm, run(algorithm, seq)[0])


@given(limits, rates, requests)
def test_gcra_decides_exactly_as_the_token_bucket_it_models(burst, rate, sequence):
    _, by_gcra = run(Gcra(rate, burst), sequence)
    _, by_bucket = run(TokenBucket(burst, rate), sequence)
    for (now, n, gcra), (_, _, bucket) in zip(by_gcra, by_bucket, strict=True):
        assert gcra.go == bucket.go, (now, n)
        assert gcra.remaining == bucket.remaining
        assert gcra.retry_after == pytest.approx(bucket.retry_after)


@given(limits, windows, requests)
def test_the_sliding_window_counter_keeps_each_window_and_any_window_span_bounded(
    limit, window, sequence
):
    algorithm = SlidingWindowCounter(limit, window)
    admitted, _ = run(algorithm, sequence)
    keeps_its_rule(algorithm, admitted)
    # Approximate, but never more than twice the limit in any span of one window.
    for i, (start, _) in enumerate(admitted):
        assert sum(n for at, n in admitted[i:] if at < start + window) <= 2 * limit


ALGORITHMS = [
    lambda limit, rate, window: TokenBucket(limit, rate),
    lambda limit, rate, window: Gcra(rate, limit),
    lambda limit, rate, window: FixedWindow(limit, window),
    lambda limit, rate, window: SlidingLog(limit, window),
    lambda limit, rate, window: SlidingWindowCounter(limit, window),
]


@pytest.mark.parametrize("make", ALGORITHMS, ids=["bucket", "gcra", "fixed", "log", "counter"])
@settings(max_examples=150)
@given(limit=limits, rate=rates, window=windows, sequence=requests)
def test_retry_after_is_long_enough_and_remaining_is_what_is_left(
    make, limit, rate, window, sequence
):
    """After a sorry, the same request goes once `retry_after` has passed (a hair more: the
    log needs its admissions to span *more* than the window); after a go, `remaining` more go
    at once and one more does not."""
    algorithm = make(limit, rate, window)
    now = 1000.0
    state = algorithm.new_state(now)
    for gap, n in sequence:
        now += gap * TICK
        n = min(n, algorithm.max_weight)
        decision = algorithm.check(state, n, now)
        if decision.go:
            assert decision.retry_after == 0
            if decision.remaining and not isinstance(algorithm, SlidingWindowCounter):
                probe = _copy(algorithm, state)
                assert algorithm.check(probe, decision.remaining, now).go
                if decision.remaining + 1 <= algorithm.max_weight:
                    assert not algorithm.check(probe, 1, now).go
        else:
            assert decision.retry_after > 0
            later = now + decision.retry_after + 1e-9
            assert algorithm.check(_copy(algorithm, state), n, later).go


def _copy(algorithm, state):
    copy = algorithm.new_state(0.0)
    for name in type(state).__slots__:
        value = getattr(state, name)
        setattr(copy, name, list(value) if isinstance(value, list) else value)
    return copy


def test_clock_edges_of_the_sliding_log_and_the_fixed_window():
    log = SlidingLog(2, 1.0)
    state = log.new_state(0.0)
    assert log.check(state, 1, 10.0).go and log.check(state, 1, 10.5).go
    # Exactly one window after the first: three would span exactly the window, not more.
    assert not log.check(state, 1, 11.0).go
    assert log.check(state, 1, 11.0 + TICK).go

    window = FixedWindow(2, 1.0)
    state = window.new_state(0.0)
    assert window.check(state, 2, 10.999).go
    decision = window.check(state, 1, 10.999)
    assert not decision.go and decision.retry_after == pytest.approx(0.001)
    assert window.check(state, 2, 11.0).go  # a new window begins on its boundary


def test_weights_count_as_that_many_requests():
    bucket = TokenBucket(5, 1.0)
    state = bucket.new_state(0.0)
    assert bucket.check(state, 3, 0.0).remaining == 2
    decision = bucket.check(state, 3, 0.0)
    assert not decision.go and decision.retry_after == pytest.approx(1.0)
    log = SlidingLog(4, 1.0)
    state = log.new_state(0.0)
    assert log.check(state, 3, 0.0).go
    assert not log.check(state, 2, 0.5).go
    assert log.check(state, 1, 0.5).go


def test_memory_per_key_is_bounded_and_idle_keys_become_evictable():
    log = SlidingLog(3, 1.0)
    state = log.new_state(0.0)
    for i in range(100):
        log.check(state, 1, i * 0.01)
    assert len(state.times) <= 3
    assert log.idle_at(state) <= 0.99 + 1.0
    bucket = TokenBucket(4, 2.0)
    state = bucket.new_state(0.0)
    bucket.check(state, 4, 0.0)
    assert bucket.idle_at(state) == pytest.approx(2.0)


def test_late_admissions_from_elsewhere_report_the_overshoot_they_reveal():
    window = FixedWindow(3, 1.0)
    state = window.new_state(0.0)
    assert window.check(state, 3, 0.2).go
    assert window.consume(state, 2, 0.1) == 2  # another node admitted 2 in the same window
    assert window.consume(state, 1, -0.5) == 0  # a window already over counts no more
    bucket = TokenBucket(2, 1.0)
    state = bucket.new_state(0.0)
    assert bucket.check(state, 2, 0.0).go
    assert bucket.consume(state, 1, 0.0) == pytest.approx(1.0)
    log = SlidingLog(2, 1.0)
    state = log.new_state(0.0)
    assert log.check(state, 1, 5.0).go and log.check(state, 1, 5.5).go
    assert log.consume(state, 1, 5.2) == 1
    gcra = Gcra(1.0, 2)
    state = gcra.new_state(0.0)
    assert gcra.check(state, 2, 0.0).go
    assert gcra.consume(state, 1, 0.0) == pytest.approx(1.0)


@pytest.mark.parametrize("make", ALGORITHMS, ids=["bucket", "gcra", "fixed", "log", "counter"])
@settings(max_examples=50)
@given(limit=limits, rate=rates, window=windows, sequence=requests)
def test_a_state_carried_to_another_node_decides_the_same(make, limit, rate, window, sequence):
    algorithm = make(limit, rate, window)
    now = 1000.0
    state = algorithm.new_state(now)
    for gap, n in sequence:
        now += gap * TICK
        algorithm.check(state, min(n, algorithm.max_weight), now)
    values = algorithm.values(state, now)
    assert all(isinstance(value, float) for value in values)
    carried = algorithm.from_values(values, now, ratio=1.0)  # the same clock: the same state
    for step in range(1, 20):
        later = now + step * 0.1
        assert algorithm.check(carried, 1, later) == algorithm.check(state, 1, later)


@pytest.mark.parametrize("make", ALGORITHMS, ids=["bucket", "gcra", "fixed", "log", "counter"])
@settings(max_examples=150)
@given(
    limit=limits,
    rate=rates,
    window=windows,
    before=requests,
    after=requests,
    known=st.integers(0, 120),
    overlap=st.integers(0, 400),
)
def test_a_key_that_starts_spent_keeps_the_rule_whatever_its_failed_owner_admitted(
    make, limit, rate, window, before, after, known, overlap
):
    """The failed owner decided `before` until `at`; the new owner knew the first `known` of
    those requests (an older account of the key) and starts from it merged with `spent(at)`.
    Its requests may come before `at` too, among the old owner's last ones. Together, what
    both admitted keeps the rule."""
    algorithm = make(limit, rate, window)
    admitted_before, decisions = run(algorithm, before)
    at = decisions[-1][0]
    older, _ = _state_after(algorithm, before[:known])
    state = algorithm.merge(older, algorithm.spent(at))
    now = 1000.0 + overlap * TICK
    admitted_after = []
    for gap, n in after:
        now += gap * TICK
        n = min(n, algorithm.max_weight)
        if algorithm.check(state, n, now).go:
            assert now >= at  # nothing before the old owner's last moment
            admitted_after.append((now, n))
    keeps_its_rule(algorithm, admitted_before + admitted_after)


@pytest.mark.parametrize("make", ALGORITHMS, ids=["bucket", "gcra", "fixed", "log", "counter"])
@settings(max_examples=100)
@given(limit=limits, rate=rates, window=windows, sequence=requests, known=st.integers(0, 120))
def test_merging_an_older_account_of_a_key_into_a_newer_one_changes_nothing(
    make, limit, rate, window, sequence, known
):
    algorithm = make(limit, rate, window)
    older, _ = _state_after(algorithm, sequence[:known])
    newer, now = _state_after(algorithm, sequence)
    for merged in (algorithm.merge(older, newer), algorithm.merge(newer, older)):
        assert algorithm.values(merged, now) == algorithm.values(newer, now) or all(
            algorithm.check(_copy(algorithm, merged), 1, now + step * 0.1)
            == algorithm.check(_copy(algorithm, newer), 1, now + step * 0.1)
            for step in range(20)
        )


def _state_after(algorithm, sequence, start=1000.0):
    """The state of a key after `sequence` (as `run` feeds it), and the time of its last request."""
    now = start
    state = algorithm.new_state(now)
    for gap, n in sequence:
        now += gap * TICK
        algorithm.check(state, min(n, algorithm.max_weight), now)
    return state, now
