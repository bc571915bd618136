"""What the promises do not cover in a chaos run, and nothing else: what a node does from its old
state when it wakes from a pause (SIGSTOP) long enough that the others took its share over.

DESIGN.md's promises hold "through node crashes, restarts and failover"; docs/cluster.md (Not
done) says that a node paused longer than that "may still answer from its state for a moment
when it wakes": nothing stops a node's clock-driven work while it is frozen, and on waking it
acts before it hears that it was counted down. A pause counts when it lasted longer than
`down_after` less one gossip interval: the others may then have heard nothing from it for
`down_after`, and taken over. Shorter pauses excuse nothing, nor do kills. What is excused,
each as narrowly as the history allows (every excused violation is still printed as such):

1. Stale answers. Grants that clients saw within `STALE_MOMENT` after the wake-up are left out
   of the checks: the woken node may have granted from its old queue, or passed on a grant its
   owner had meanwhile withdrawn.
2. Stale expiry. A peer homed at the paused node (by the ring of all nodes, which is whole
   before every fault) was renewed at its new home during the pause, but the paused node's
   copy of it expired while frozen; on waking it tells the owners to release that peer's
   locks, and they do (the release quotes the lock's ticket). So a lock of such a peer held
   across the wake-up counts as released at the wake-up; its client is not told.
3. The stand-in's tokens. A semaphore's owner that wakes and is not made to step down (its
   view counts the others down and, from their first gossip, up again, between two looks of
   its semaphore service, `WATCH_INTERVAL`) owns the semaphore again, but its stand-in hands
   back only what is in use: an idle semaphore's token count stays behind, and the owner's
   tokens go on from its own count, below those the stand-in gave. A falling token
   (`tokens_rise` reports the first) is excused after the wake-up of its semaphore's owner (by
   the ring of all nodes) if the token it falls below was given during that pause.

A lease lost (`no_lease_lost`) and "stuck" are never excused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from sluicegate.cluster.ring import Ring, peer_key, semaphore_key
from sluicegate.node.config import NodeConfig

from .checkers import check_history, never_more_than_max, tokens_rise
from .history import Event, History

# How long after waking a node's answers may still come from its old state (it answers its
# backlog at once; what it hears from the others reaches it within a gossip round or two).
STALE_MOMENT = 1.0
# (Violations start with the checker's tag, `[max]`.)
_MAX_VIOLATION = re.compile(
    r"^(?:\[\S+\] )?(\S+): (\S+) held \d+ > max \d+ \(granted \d+ to (\S+)\)$"
)
_TOKEN_VIOLATION = re.compile(r"^(?:\[\S+\] )?(\S+): token \d+ on (\S+) to \S+ after (\d+) to ")


@dataclass(frozen=True)
class Wakeup:
    """A node paused from `paused_at` until `woke_at`, long enough that others took over."""

    node: str
    paused_at: float
    woke_at: float


def judge(
    history: History, config: NodeConfig, expires_in: float, members: list[str]
) -> tuple[list[str], list[str]]:
    """(violations, excused): what the checkers find, split by the excuses above."""
    violations = check_history(history, config, expires_in)
    wakeups = stale_wakeups(history, config.cluster.down_after - config.cluster.gossip_interval)
    if not wakeups:
        return violations, []
    forgiven = History()
    forgiven.events = _forgiving(history.events, wakeups, Ring(members))
    still_over = {_max_key(v) for v in never_more_than_max(forgiven, config)}
    excused_tokens = set(_stand_in_tokens(history, wakeups, Ring(members)))
    kept, excused = [], []
    for violation in violations:
        key = _max_key(violation)
        if key is not None and key not in still_over:
            excused.append(violation)
        elif violation in excused_tokens:
            excused.append(violation)
        else:
            kept.append(violation)
    return kept, excused


def stale_wakeups(history: History, longer_than: float) -> list[Wakeup]:
    """The pauses (`pause` or `long_pause` faults) that lasted longer than `longer_than`."""
    started: dict[str, float] = {}
    wakeups = []
    for event in history.events:
        if event.kind == "fault" and "pause" in event.detail:
            started[event.who] = event.at
        elif event.kind == "healed" and "pause" in event.detail and event.who in started:
            paused_at = started.pop(event.who)
            if event.at - paused_at > longer_than:
                wakeups.append(Wakeup(event.who, paused_at, event.at))
    return wakeups


def _forgiving(events: list[Event], wakeups: list[Wakeup], ring: Ring) -> list[Event]:
    """The history with excuses 1 and 2 applied: stale grants (and their releases) left out,
    and the holds the woken node's stale expiry dropped ended at its wake-up."""
    result: list[Event] = []
    # Each locker task holds one lock at a time: its release follows its grant.
    holding: dict[str, tuple[int, Event]] = {}
    dropped: set[str] = set()
    for event in events:
        if event.kind == "granted":
            if any(w.woke_at <= event.at <= w.woke_at + STALE_MOMENT for w in wakeups):
                dropped.add(event.who)
                continue
            holding[event.who] = (len(result), event)
        elif event.kind == "released":
            if event.who in dropped:
                dropped.discard(event.who)
                continue
            grant = holding.pop(event.who, None)
            if grant is not None:
                event = _cut_at_stale_expiry(grant[1], event, wakeups, ring)
        result.append(event)
    return sorted(result, key=lambda e: e.at)


def _cut_at_stale_expiry(grant: Event, release: Event, wakeups: list[Wakeup], ring: Ring) -> Event:
    home = ring.owner(peer_key(grant.peer_id))
    for wakeup in wakeups:
        if wakeup.node == home and grant.at < wakeup.woke_at < release.at:
            return replace(release, at=wakeup.woke_at)
    return release


def _stand_in_tokens(history: History, wakeups: list[Wakeup], ring: Ring) -> list[str]:
    """`tokens_rise` violations excused by excuse 3 (or by 1: a stale grant's token)."""
    granted_at = {
        (e.semaphore, e.token): e.at for e in history.events if e.kind == "granted" and e.token
    }
    excused = []
    for violation in tokens_rise(history):
        match = _TOKEN_VIOLATION.match(violation)
        if match is None:
            continue
        at, semaphore, above = float(match[1]), match[2], granted_at.get((match[2], int(match[3])))
        for wakeup in wakeups:
            stale = wakeup.woke_at <= at <= wakeup.woke_at + STALE_MOMENT
            stand_in = (
                ring.owner(semaphore_key(semaphore)) == wakeup.node
                and at >= wakeup.woke_at
                and above is not None
                and wakeup.paused_at <= above <= wakeup.woke_at
            )
            if stale or stand_in:
                excused.append(violation)
                break
    return excused


def _max_key(violation: str) -> tuple[str, str, str] | None:
    match = _MAX_VIOLATION.match(violation)
    return (match[1], match[2], match[3]) if match else None
