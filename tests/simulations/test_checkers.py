"""The `once` checker on histories written by hand: what counts as one decision of a retried
rate-limit request, and what as two."""

from __future__ import annotations

from simulations.checkers import rate_retries_once
from simulations.history import History
from simulations.run import CONFIG
from simulations.workload import RateSend

RETRY_ID = 7


def send(node: str, sent: float, answered: float, remaining: int, given_up=None) -> RateSend:
    return RateSend(
        "c1", node, "wait", "exact", "k0", 1, 1, (RETRY_ID,), sent,
        answered=answered, goes=[True], remaining=[remaining], given_up=given_up,
    )  # fmt: skip


def history_of(*sends: RateSend) -> History:
    history = History(clock=lambda: 0.0)
    history.rate.extend(sends)
    return history


def test_a_retry_answered_with_another_go_is_a_go_decided_twice():
    first, retry = send("n2", 16.8, 17.0, 1), send("n3", 21.9, 22.0, 2)
    [violation] = rate_retries_once(history_of(first, retry), CONFIG)
    assert violation.startswith("[once] 22.0000: c1's wait of exact 'k0' went at n2")


def test_a_go_answered_after_the_client_left_its_connection_was_never_taken():
    # The client left n2's connection (it stalled) at 16.975, the go came on it at 17.0, and
    # the client asked again: a new owner, which took the key spent, decided anew.
    first, retry = send("n2", 16.8, 17.0, 1, given_up=16.975), send("n3", 21.9, 22.0, 2)
    assert rate_retries_once(history_of(first, retry), CONFIG) == []
    # Left after the answer came: the client took that go, and a retry must repeat it.
    taken = send("n2", 16.8, 17.0, 1, given_up=17.2)
    assert len(rate_retries_once(history_of(taken, retry), CONFIG)) == 1
