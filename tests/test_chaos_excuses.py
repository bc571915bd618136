"""The excuses of a chaos run (`simulations/chaos_excuses.py`) forgive what a node does from its
old state when it wakes from a long pause, and nothing else: not after a kill, not after a short
pause, not for a peer homed elsewhere, not a lease lost."""

from __future__ import annotations

import itertools

from simulations.chaos import CONFIG, EXPIRES_IN, NODE_IDS
from simulations.chaos_excuses import STALE_MOMENT, judge
from simulations.history import Event, History
from sluicegate.cluster.ring import Ring, peer_key, semaphore_key

RING = Ring(NODE_IDS)
OWNER_OF_A = RING.owner(semaphore_key("A"))
# A pause this long lets the others count the node down and take its share over.
LONG = CONFIG.cluster.down_after + 1.0
SHORT = CONFIG.cluster.down_after / 2


def homed_at(node: str) -> int:
    """A peer id whose home is `node` while all nodes are members."""
    return next(i for i in itertools.count(1) if RING.owner(peer_key(i)) == node)


def history_of(*events: Event) -> History:
    history = History()
    history.events = sorted(events, key=lambda e: e.at)
    return history


def fault(kind: str, node: str, start: float, lasting: float) -> list[Event]:
    return [
        Event(start, "fault", node, detail=f"{kind} for {lasting:.2f}s"),
        Event(start + lasting, "healed", node, detail=kind),
    ]


def hold(who: str, semaphore: str, start: float, end: float, token=None, peer_id=1) -> list:
    return [
        Event(start, "granted", who, semaphore, 1, token, peer_id),
        Event(end, "released", who, semaphore, 1),
    ]


def check(*events: Event) -> tuple[list[str], list[str]]:
    return judge(history_of(*events), CONFIG, EXPIRES_IN, list(NODE_IDS))


def overlap_across_a_wakeup(kind: str, lasting: float, peer_id: int) -> list[Event]:
    """c0.0 holds A from before node n2 wakes until after; c1.0 gets A 2 s after the wake."""
    woke = 10.0 + lasting
    return [
        *fault(kind, "n2", 10.0, lasting),
        *hold("c0.0", "A", woke - 1.0, woke + 5.0, peer_id=peer_id),
        *hold("c1.0", "A", woke + 2.0, woke + 3.0, peer_id=homed_at("n1")),
    ]


def test_a_lock_the_woken_nodes_stale_expiry_dropped_is_excused():
    violations, excused = check(*overlap_across_a_wakeup("long_pause", LONG, homed_at("n2")))
    assert violations == []
    assert len(excused) == 1 and "A held 2 > max 1" in excused[0]


def test_a_peer_homed_elsewhere_is_not_excused():
    violations, excused = check(*overlap_across_a_wakeup("long_pause", LONG, homed_at("n3")))
    assert len(violations) == 1 and excused == []


def test_a_short_pause_excuses_nothing():
    violations, excused = check(*overlap_across_a_wakeup("pause", SHORT, homed_at("n2")))
    assert len(violations) == 1 and excused == []


def test_a_kill_excuses_nothing():
    violations, excused = check(*overlap_across_a_wakeup("kill", LONG, homed_at("n2")))
    assert len(violations) == 1 and excused == []


def test_a_grant_the_moment_a_node_wakes_is_excused_and_later_ones_are_not():
    woke = 10.0 + LONG
    holder = hold("c0.0", "A", woke - 0.5, woke + 4.0, peer_id=homed_at("n1"))
    stale = hold("c1.0", "A", woke + STALE_MOMENT / 2, woke + 3.0, peer_id=homed_at("n1"))
    late = hold("c2.0", "A", woke + STALE_MOMENT + 1.0, woke + 3.0, peer_id=homed_at("n1"))
    violations, excused = check(*fault("long_pause", "n2", 10.0, LONG), *holder, *stale)
    assert violations == [] and len(excused) == 1
    violations, excused = check(*fault("long_pause", "n2", 10.0, LONG), *holder, *late)
    assert len(violations) == 1 and excused == []


def tokens_across_a_pause_of(node: str) -> list[Event]:
    """The stand-in gives token 100 during `node`'s pause; token 50 comes after the wake."""
    return [
        *fault("long_pause", node, 10.0, LONG),
        *hold("c0.0", "A", 11.0, 11.5, token=7),
        *hold("c1.0", "A", 12.0, 12.5, token=100),
        *hold("c2.0", "A", 10.0 + LONG + 5.0, 10.0 + LONG + 6.0, token=50),
    ]


def test_a_token_below_the_stand_ins_after_the_owner_woke_is_excused():
    violations, excused = check(*tokens_across_a_pause_of(OWNER_OF_A))
    assert violations == []
    assert len(excused) == 1 and "token 50 on A" in excused[0]


def test_a_falling_token_after_another_nodes_pause_is_not_excused():
    other = next(node for node in NODE_IDS if node != OWNER_OF_A)
    violations, excused = check(*tokens_across_a_pause_of(other))
    assert len(violations) == 1 and excused == []


def test_a_lease_lost_is_never_excused():
    violations, excused = check(
        *fault("long_pause", "n2", 10.0, LONG),
        Event(11.0, "granted", "c0.0", "B", 1, 5, homed_at("n2")),
        Event(10.0 + LONG + 0.1, "released", "c0.0", "B", 1, detail="lost"),
    )
    assert len(violations) == 1 and "lost its lease" in violations[0]
    assert excused == []
