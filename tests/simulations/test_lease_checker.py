"""The `rate-lease` checker on histories written by hand: goes clients decided from slices of a
token bucket (capacity 4, 2 a second, as `simulations/run.py` configures "leased"), judged
against capacity + rate x t over every interval between two goes."""

from __future__ import annotations

from simulations.checkers import rate_leases
from simulations.history import History
from simulations.run import CONFIG


def history_of(*goes: tuple[float, str, int]) -> History:
    """Goes at (time, key, weight), decided by client c0."""
    at = [0.0]
    history = History(clock=lambda: at[0])
    for when, key, n in goes:
        at[0] = when
        history.lease_went("c0", "leased", key, n)
    return history


def test_a_burst_of_the_capacity_then_the_rate_is_within_the_bound():
    burst = [(1.0, "k0", 1)] * 4
    steady = [(1.0 + 0.5 * i, "k0", 1) for i in range(1, 9)]  # 2 a second
    assert rate_leases(history_of(*burst, *steady), CONFIG) == []


def test_one_go_beyond_capacity_plus_rate_times_t_is_named_once_per_key():
    goes = [(1.0, "k0", 2), (1.1, "k0", 2), (1.2, "k1", 4), (1.25, "k0", 1), (1.3, "k0", 1)]
    [violation] = rate_leases(history_of(*goes), CONFIG)
    # 5 went from 1.0 to 1.25: more than 4 + 2 x 0.25.
    assert violation == (
        "[rate-lease] 1.2500: leased 'k0' admitted 5 from 1.0000 s, beyond 4 + 2 x 0.2500 s"
    )


def test_the_interval_that_breaks_the_bound_may_start_at_any_go():
    # Within the bound from the first go on, but not from the third: 6 went in 0.5 s.
    goes = [(0.0, "k0", 1), (3.0, "k0", 2), (3.4, "k0", 2), (3.5, "k0", 2)]
    [violation] = rate_leases(history_of(*goes), CONFIG)
    assert "admitted 6 from 3.0000 s" in violation
