"""The client's sans-IO session: which peer a lock uses, and what a restore carries."""

from __future__ import annotations

from sluicegate.client.session import (
    Deadlock,
    RequestRefused,
    Session,
    UnknownPeer,
    error_from,
)


def test_a_restore_carries_exactly_the_locks_held():
    session = Session(expires_in=10)
    peer = session.created(7, sent_at=0.0)
    assert session.acquired(peer, "A", 2, {"acquired": True, "token": 5}) is True
    assert session.acquired(peer, "B", 1, {"acquired": False}) is False  # still waiting
    restore = session.restore(peer)
    assert restore["op"] == "restore" and restore["peer"] == 7
    assert restore["acquired"] == {"A": 2}
    assert restore["expires_in"] == 10
    session.released(peer, "A")
    assert session.restore(peer)["acquired"] == {}


def test_a_peer_goes_back_to_the_idle_ones_only_when_it_holds_nothing():
    session = Session(expires_in=10)
    busy, free = session.created(1, sent_at=0.0), session.created(2, sent_at=0.0)
    session.acquired(busy, "A", 1, {"acquired": True, "token": 1})
    session.put_back(busy)
    session.put_back(free)
    assert session.idle_peer() is free
    assert session.idle_peer() is None


def test_requests_have_fresh_ids_and_leave_out_empty_fields():
    session = Session(expires_in=10)
    peer = session.created(3, sent_at=0.0)
    first = session.acquire(peer, "A", 1, wait=None, seq=session.next_op(peer))
    second = session.acquire(peer, "A", 1, wait=2.0, seq=session.next_op(peer))
    assert first["id"] != second["id"]
    assert "wait" not in first and second["wait"] == 2.0


def test_operations_on_a_peer_are_numbered_and_a_restore_says_the_last():
    session = Session(expires_in=10)
    peer, other = session.created(3, sent_at=0.0), session.created(4, sent_at=0.0)
    assert "seq" not in session.restore(peer)  # nothing numbered yet
    acquire = session.acquire(peer, "A", 1, wait=None, seq=session.next_op(peer))
    release = session.release(peer, "A", seq=session.next_op(peer))
    assert (acquire["seq"], release["seq"]) == (1, 2)
    # A restore does not move on: the operation it comes before is retried with its number.
    assert session.restore(peer)["seq"] == 2
    assert session.next_op(other) == 1  # each peer counts its own


def test_errors_map_to_exception_types_with_their_codes():
    assert isinstance(error_from({"error": "deadlock", "message": "m"}), Deadlock)
    assert isinstance(error_from({"error": "unknown_peer"}), UnknownPeer)
    other = error_from({"error": "already_pending", "message": "one at a time"})
    assert isinstance(other, RequestRefused) and other.code == "already_pending"


def test_a_peer_lost_forgets_its_held_locks_and_no_other_peers():
    session = Session(expires_in=10)
    peer, other = session.created(4, sent_at=0.0), session.created(6, sent_at=0.0)
    session.acquired(peer, "A", 1, {"acquired": True, "token": 1})
    session.acquired(other, "B", 1, {"acquired": True, "token": 2})
    session.lost(peer)
    assert session.restore(peer)["acquired"] == {}
    assert session.restore(other)["acquired"] == {"B": 1}


def test_a_peer_whose_leases_were_lost_is_dropped_once_put_back():
    # A node may count a lock of it that its task gave up on when the lease was lost.
    session = Session(expires_in=10)
    peer = session.created(4, sent_at=0.0)
    session.acquired(peer, "B", 1, {"acquired": True, "token": 1})
    session.lost(peer)
    session.put_back(peer)
    assert session.idle_peer() is None and 4 not in session.peers


def test_a_peer_lives_its_expiry_from_when_its_last_renewal_was_sent():
    session = Session(expires_in=10)
    peer = session.created(8, sent_at=3.0)
    assert session.expires_at(peer) == 13.0
    session.renewed(peer, sent_at=7.5)  # a heartbeat answered
    assert session.expires_at(peer) == 17.5
    session.renewed(peer, sent_at=5.0)  # a slower one, sent earlier, answered later
    assert session.expires_at(peer) == 17.5


def test_a_peer_whose_release_is_unsettled_is_dropped_not_reused():
    session = Session(expires_in=10)
    peer = session.created(5, sent_at=0.0)
    peer.unsettled = True
    session.put_back(peer)
    assert session.idle_peer() is None and 5 not in session.peers


def test_refusals_past_a_limit_are_limit_reached_naming_the_limit():
    from sluicegate.client import LimitReached
    from sluicegate.client.session import error_from

    for code in ("quota_full", "beyond_limit"):
        error = error_from({"id": 1, "error": code, "message": "... ([limits] peers)"})
        assert isinstance(error, LimitReached) and error.code == code
        assert str(error).endswith("([limits] peers)")
