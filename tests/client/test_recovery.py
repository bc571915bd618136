"""The client's recovery decisions (`client/recovery.py`), without a network."""

import random

import pytest

from sluicegate.client.recovery import (
    AVOID_FOR,
    BACKOFF_FIRST,
    BACKOFF_MAX,
    MOVE_AFTER,
    Backoff,
    CallRecovery,
    ConnectionLost,
    GiveUp,
    NodeChoice,
    RestorePeer,
    Retry,
)
from sluicegate.client.session import RequestRefused, Unavailable, UnknownPeer, error_from


def test_a_forgotten_peer_is_restored_once_then_the_call_gives_up():
    recovery = CallRecovery(0.0, random.Random(1), has_peer=True)
    assert recovery.after(UnknownPeer("gone"), 0.1) == RestorePeer()
    again = recovery.after(UnknownPeer("gone again"), 0.2)
    assert isinstance(again, GiveUp) and isinstance(again.error, UnknownPeer)


def test_a_call_without_a_peer_does_not_restore():
    recovery = CallRecovery(0.0, random.Random(1), has_peer=False)
    decision = recovery.after(UnknownPeer("gone"), 0.1)
    assert isinstance(decision, GiveUp)


@pytest.mark.parametrize("failure", [ConnectionLost("broke"), Unavailable("no majority")])
def test_broken_connections_and_an_unavailable_cluster_are_retried_until_patience_ends(failure):
    recovery = CallRecovery(10.0, random.Random(2), has_peer=True, patience=5.0)
    now, waits = 10.0, []
    while True:
        decision = recovery.after(failure, now)
        if isinstance(decision, GiveUp):
            break
        assert isinstance(decision, Retry)
        waits.append(decision.wait)
        now += decision.wait
    assert now >= 15.0 and now - waits[-1] < 15.0
    assert isinstance(decision.error, Unavailable)
    assert BACKOFF_FIRST * 0.5 <= waits[0] <= BACKOFF_FIRST * 1.5
    assert max(waits) <= BACKOFF_MAX * 1.5
    # Doubling: the base of each wait (its jitter removed) grows until the cap.
    assert waits[4] > waits[0] * 2


def test_a_node_that_keeps_answering_unavailable_is_left_for_the_next():
    recovery = CallRecovery(0.0, random.Random(4), has_peer=True)
    now, decisions = 0.0, []
    while now < 3.0:
        decision = recovery.after(Unavailable("not served by n3 now"), now)
        decisions.append((now, decision.elsewhere))
        now += decision.wait
    moves = [at for at, elsewhere in decisions if elsewhere]
    assert moves and moves[0] >= MOVE_AFTER
    assert not any(elsewhere for at, elsewhere in decisions if at < MOVE_AFTER)
    # A broken connection (a new node next) starts the count again.
    fresh = CallRecovery(0.0, random.Random(4), has_peer=True)
    fresh.after(Unavailable("no majority"), 0.0)
    fresh.after(ConnectionLost("broke"), 0.5)
    assert not fresh.after(Unavailable("no majority"), 1.2).elsewhere


def test_node_choice_skips_to_the_next_url():
    choice = NodeChoice(["a", "b", "c"], random.Random(5))
    choice.skip(now=0.0)
    assert choice.url == "b"
    choice.skip(now=1.0 * AVOID_FOR)
    choice.skip(now=2.0 * AVOID_FOR)
    assert choice.url == "a"


def test_node_choice_passes_over_a_node_left_lately_while_another_is_not():
    choice = NodeChoice(["a", "b", "c"], random.Random(5))
    choice.skip(now=0.0)  # leaves a for b
    choice.skip(now=0.5)  # leaves b: c next, never a (left 0.5 s ago)
    assert choice.url == "c"
    choice.skip(now=1.0)  # leaves c: a and b both left lately, so the next in turn, a
    assert choice.url == "a"
    choice.skip(now=0.5 + AVOID_FOR)  # leaves a: b is a candidate again
    assert choice.url == "b"


def test_other_refusals_are_not_retried():
    decision = CallRecovery(0.0, random.Random(3), has_peer=True).after(RequestRefused("no"), 0)
    assert isinstance(decision, GiveUp) and isinstance(decision.error, RequestRefused)


def test_backoff_is_jittered_so_clients_do_not_return_in_step():
    first_waits = {Backoff(random.Random(seed)).wait() for seed in range(20)}
    assert len(first_waits) == 20


def test_node_choice_stays_with_a_working_node_and_moves_on_from_a_dead_one():
    nodes = NodeChoice(["ws://a/ws", "ws://b/ws", "ws://c/ws"], random.Random(4))
    assert nodes.url == "ws://a/ws"
    nodes.connected()
    assert nodes.url == "ws://a/ws"
    assert nodes.failed(now=1.0, give_up_at=100.0) == Retry(0.0)
    assert nodes.url == "ws://b/ws"
    nodes.connected()
    # b breaks later: c next at once, then a; a whole round without an answer waits.
    assert nodes.failed(2.0, 100.0) == Retry(0.0)
    assert nodes.url == "ws://c/ws"
    assert nodes.failed(2.0, 100.0) == Retry(0.0)
    assert nodes.url == "ws://a/ws"
    assert nodes.failed(2.0, 100.0).wait > 0
    assert nodes.url == "ws://b/ws"


def test_node_choice_gives_up_after_a_round_past_the_deadline():
    nodes = NodeChoice(["ws://a/ws", "ws://b/ws"], random.Random(5))
    assert nodes.failed(50.0, 40.0) == Retry(0.0)  # b is still worth a try
    decision = nodes.failed(50.0, 40.0)
    assert isinstance(decision, GiveUp) and "ws://a/ws" in str(decision.error)


def test_unavailable_answers_count_per_node():
    """A call that slept while another call moved the client to another node: the new node's
    first `unavailable` starts the count again (simulations seed 3: the client left a node that
    had answered unavailable once, for the paused one, and its peer expired meanwhile)."""
    recovery = CallRecovery(0.0, random.Random(6), has_peer=True)
    first, second = object(), object()
    recovery.after(Unavailable("not served by n2 now"), 0.0, first)
    assert not recovery.after(Unavailable("not served by n2 now"), MOVE_AFTER / 2, first).elsewhere
    assert not recovery.after(Unavailable("n2 went down"), 4.8, second).elsewhere
    assert recovery.after(Unavailable("n2 went down"), 4.8 + MOVE_AFTER, second).elsewhere


def _unavailable(retry_here_for: float) -> Unavailable:
    return error_from(
        {"id": 1, "error": "unavailable", "message": "no", "retry_here_for": retry_here_for}
    )


def test_a_node_that_reaches_a_quorum_is_asked_as_long_as_it_says():
    """A 503 with `retry_here_for` (the node hears of most members; the slot's owner is lost and
    the majority takes it over) keeps the call there that long, not `MOVE_AFTER`: leaving it
    for a node of the minority, and then passing it over, outlasted a lease (five-node seed
    497871340)."""
    assert _unavailable(4.5).retry_here_for == 4.5
    assert Unavailable("no").retry_here_for == 0.0
    recovery = CallRecovery(0.0, random.Random(8), has_peer=True)
    node = object()
    now = 0.0
    while now < 4.5:
        assert not recovery.after(_unavailable(4.5), now, node).elsewhere
        now += 0.3
    assert recovery.after(_unavailable(4.5), now, node).elsewhere
    # The node cut off from most (it stopped saying so): left after `MOVE_AFTER`, as before.
    recovery = CallRecovery(0.0, random.Random(8), has_peer=True)
    assert not recovery.after(_unavailable(4.5), 0.0, node).elsewhere
    assert recovery.after(_unavailable(0), MOVE_AFTER, node).elsewhere
