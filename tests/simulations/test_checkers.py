"""Checkers on histories written by hand: what counts as one decision of a retried rate-limit
request (`once`), what tokens must do on any semaphore (`tokens`), what a new owner must
have gained (`o2`), and exact rate limits on each node's own clock (`rate-window`,
`rate-handover`)."""

from __future__ import annotations

from simulations.checkers import (
    committed_writes_survive,
    no_lease_lost,
    rate_exact_by_node_clocks,
    rate_retries_once,
    tokens_rise,
)
from simulations.clocks import TimeOfDay
from simulations.history import Event, History
from simulations.rate_taps import Go, Taken
from simulations.run import CONFIG
from simulations.servers import Gain, ServerLog, Write, Writer, signature
from simulations.workload import RateSend
from sluicegate.cluster.ring import peer_key
from sluicegate.cluster.semaphore_leases import LockRecord, SemaphoreRecord
from sluicegate.cluster.slots import Ballot, slot_of

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


def test_a_lock_asked_after_another_was_granted_needs_a_larger_token_on_every_semaphore():
    history = History(clock=lambda: 0.0)
    history.events += [
        Event(1.0, "asked", "c0.0", "B", 1),
        Event(1.1, "granted", "c0.0", "B", 1, token=12),
        Event(2.0, "asked", "c1.0", "B", 2),
        Event(2.1, "granted", "c1.0", "B", 2, token=12),
    ]
    assert tokens_rise(history) == [
        "[tokens] 2.1000: token 12 on B to c1.0 (asked 2.0000) after 12 to c0.0 (granted 1.1000)",
        "[tokens] 2.1000: token 12 on B to c1.0, and to c0.0 before",
    ]
    # Asked before the other was granted: either order is right, if the tokens differ.
    history.events[2] = Event(1.05, "asked", "c1.0", "B", 2)
    history.events[3] = Event(2.1, "granted", "c1.0", "B", 2, token=11)
    assert tokens_rise(history) == []


def lock(peer_id: int, token: int) -> LockRecord:
    return LockRecord("A", peer_id, 1, 1, token, False, peer_id)


def test_a_committed_write_missing_from_the_next_owners_state_breaks_o2():
    slot, first, second = 7, Ballot(1, 1, "n1"), Ballot(1, 2, "n2")
    servers = ServerLog()
    writer = servers.writers[("n1", 1), slot, first] = Writer(("n1", 1), slot, first)
    writer.writes[1] = Write(0.0, 1, True, {}, ())
    granted = {"l:5:A": signature(lock(5, 40)), "s:A": signature(SemaphoreRecord("A", 41, 6))}
    writer.writes[2] = Write(1.0, 2, False, granted, ())
    # Version 3 was sent, never committed: a new owner may or may not hold it.
    writer.writes[3] = Write(2.0, 3, False, {"l:6:A": signature(lock(6, 41))}, ())
    writer.committed, writer.committed_at = 2, 1.5

    def gained(records: dict) -> list[str]:
        servers.gains = [Gain(3.0, ("n2", 1), slot, second, first, records, False)]
        return committed_writes_survive(servers)

    assert gained(granted) == []
    assert gained({**granted, "l:6:A": signature(lock(6, 41))}) == []
    [violation] = gained({"s:A": signature(SemaphoreRecord("A", 40, 5))})
    assert violation.startswith(
        "[o2] 3.0000: slot 7 gained by n2 (life 1, ballot 2) without version 2 of n1's ballot 1"
    )
    assert "lacks or differs in l:5:A s:A" in violation


def clocks_history(offsets: dict[str, float]) -> History:
    """Lives n1 and n2 begun at 0, each node's time of day `offsets` off the true one."""
    history = History(clock=lambda: 0.0)
    history.times_of_day = {node: TimeOfDay(offset) for node, offset in offsets.items()}
    for node in offsets:
        history.deciders.began[node, 1] = 0.0
    return history


def goes(history: History, node: str, *times: float) -> None:
    history.deciders.goes.extend(Go(at, (node, 1), "exact", "k0", 1) for at in times)


def test_windows_are_each_nodes_own_and_a_go_near_an_edge_is_left_out():
    history = clocks_history({"n1": 0.4})  # n1's windows begin at .6 of the true second
    goes(history, "n1", 10.62, 10.7, 11.0, 11.55)  # all in n1's window [10.6, 11.6)
    [violation] = rate_exact_by_node_clocks(history, CONFIG)
    assert violation.startswith("[rate-window] 11.5840: n1 (life 1) admitted 4 > 3 of exact")
    history.deciders.goes[0] = Go(10.61, ("n1", 1), "exact", "k0", 1)  # within 16 ms of it
    assert rate_exact_by_node_clocks(history, CONFIG) == []


def test_a_hand_over_keeps_the_senders_last_window_in_true_time():
    history = clocks_history({"n1": 0.0, "n2": -0.5})  # n2's windows end at .5
    goes(history, "n1", 10.1, 10.2)  # 2 of n1's window [10, 11)
    history.deciders.taken.append(Taken(10.3, ("n2", 1), "n1", frozenset({("exact", "k0")})))
    goes(history, "n2", 10.4)  # the third: the limit
    assert rate_exact_by_node_clocks(history, CONFIG) == []
    goes(history, "n2", 10.45)  # n2's own window holds 2, but n1's held 4 by its end
    [violation] = rate_exact_by_node_clocks(history, CONFIG)
    assert violation.startswith("[rate-handover] 10.9840: n1's last window of exact 'k0' before")
    assert violation.endswith("held 2, and 2 more went elsewhere before it ended: 4 > 3")
    history.deciders.goes[-1] = Go(11.2, ("n2", 1), "exact", "k0", 1)  # after n1's ended
    assert rate_exact_by_node_clocks(history, CONFIG) == []


def two_actors_down(s_back_at: float | None) -> History:
    """c0.0 holds B on peer 5, whose home slot n1 acts for from 1.0; n1 goes down at 10.0, n2
    takes the slot at 11.7 and goes down at 11.75 (back at `s_back_at`, if any); the lease is
    lost at 14.0."""
    slot = slot_of(peer_key(5))
    history = History(clock=lambda: 0.0)
    history.events += [
        Event(2.0, "granted", "c0.0", "B", 1, token=3, peer_id=5),
        Event(10.0, "down", "n1"),
        Event(11.75, "down", "n2"),
        *([Event(s_back_at, "up", "n2")] if s_back_at is not None else []),
        Event(14.0, "released", "c0.0", "B", 1, detail="lost"),
    ]
    history.servers.gains += [
        Gain(1.0, ("n1", 1), slot, Ballot(1, 1, "n1"), Ballot(0, 0, ""), {}, False),
        Gain(11.7, ("n2", 1), slot, Ballot(1, 2, "n2"), Ballot(1, 1, "n1"), {}, False),
    ]
    return history


def test_a_lease_lost_to_two_acting_members_down_in_a_row_is_not_promised():
    assert no_lease_lost(two_actors_down(None), 5.0, 2.0) == []
    assert no_lease_lost(two_actors_down(13.9), 5.0, 2.0) == [], "back after a lease"


def test_a_lease_lost_when_the_second_member_came_back_at_once_is_a_violation():
    """Its new life's `Recover` ends its dead life's leases (five-node seed 811107053)."""
    lost = ["[lease] 14.0000: c0.0 lost its lease on B"]
    assert no_lease_lost(two_actors_down(11.85), 5.0, 2.0) == lost
    history = two_actors_down(None)
    history.servers.gains.pop()  # n2 never acted: one failure of an actor, one bound
    assert no_lease_lost(history, 5.0, 2.0) == lost
    history = two_actors_down(None)
    history.events[1] = Event(8.5, "down", "n1")  # before the expiry's window
    assert no_lease_lost(history, 5.0, 2.0) == lost
    history = two_actors_down(None)
    history.events[2] = Event(11.75, "down", "n2", detail="left")  # it resigned the slot
    assert no_lease_lost(history, 5.0, 2.0) == lost
