"""Invariant checkers: each reads the history the clients recorded and names what went wrong.

Each violation reads `[checker] time: what`, so that a sweep can count them by checker:
`max`, `lease`, `tokens`, `fencing`, `fifo`, `once`, `rate-exact`, `rate-gossip`,
`rate-lease`, `o2`, `liveness`, `exception`.

Client-observed holds are inside the real ones (a grant is seen after the owner made it, and a
release is sent after the client stopped using the lock), so any overlap seen here happened at
the owner too. A rate-limit decision was made between its request's sending and its answer's
arrival (both seen on the wire: simulations/workload.py's `Tap`), stamped with the nodes'
clock: virtual time in a simulation, the wall clock in a chaos run (simulations/chaos.py).

`o2` judges the servers instead: what every node life wrote, committed and gained
(simulations/servers.py), whoever's client saw it or not.

Some promises can only be judged where the order of events at a node is certain: in *quiet*
times, from `QUIET_AFTER` seconds after the cluster was whole again (every node serving and
agreeing on the members) until the next fault. Messages take no virtual time then, so requests
reach their owners in the order they were made. (A chaos run's history has no quiet times.)
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from sluicegate.cluster.ring import peer_key
from sluicegate.cluster.slots import slot_of
from sluicegate.node.config import NodeConfig

from .history import Event, History
from .node_clocks import NodeClocks
from .servers import Gain, ServerLog

# After the cluster is whole again, clients may still be backing off (at most 1 s) or moving on
# from a node that answered unavailable (after 1 s); quiet starts once they cannot be.
QUIET_AFTER = 2.0
# Two requests asked this far apart (virtual seconds) reached their owner in that order.
APART = 1e-3
# How late gossip may arrive beyond its interval in quiet times (scheduling in one instant).
GOSSIP_SLACK = 0.01


def check_history(history: History, config: NodeConfig, expires_in: float) -> list[str]:
    quiet = quiet_times(history.events)
    return [
        *never_more_than_max(history, config),
        *no_lease_lost(history, expires_in, config.cluster.lease or config.cluster.down_after),
        *tokens_rise(history),
        *fenced_writes(history),
        *fifo(history, quiet),
        *rate_retries_once(history, config),
        *rate_limits(history, config, quiet),
        *rate_exact_by_node_clocks(history, config),
        *gossip_counted_once(history),
        *rate_leases(history, config),
        *committed_writes_survive(history.servers, since=_first_whole(history.events)),
        *[f"[liveness] {e.at:.4f}: {e.detail}" for e in history.events if e.kind == "stuck"],
        *[
            f"[exception] {e.at:.4f}: a task of {e.who} raised {e.detail}"
            for e in history.events
            if e.kind == "failure"
        ],
    ]


def _first_whole(events: list[Event]) -> float:
    """When the cluster was first whole (every node serving, all agreeing on the members)."""
    return next((event.at for event in events if event.kind == "whole"), math.inf)


def quiet_times(events: list[Event]) -> list[tuple[float, float]]:
    """The intervals without faults, from `QUIET_AFTER` after the cluster was whole until the
    next fault (or the end of the workload)."""
    intervals = []
    since = None
    for event in events:
        if event.kind == "whole":
            since = event.at + QUIET_AFTER
        elif event.kind == "fault" or (event.kind == "note" and event.detail == "clients gone"):
            if since is not None and event.at > since:
                intervals.append((since, event.at))
            since = None
    if since is not None:
        intervals.append((since, math.inf))
    return intervals


def _within(quiet: list[tuple[float, float]], start: float, end: float) -> bool:
    return any(since <= start and end <= until for since, until in quiet)


def never_more_than_max(history: History, config: NodeConfig) -> list[str]:
    held: dict[str, int] = {}
    violations = []
    # At one instant, releases come before grants: a holder's end and the next one's start
    # may share a virtual time.
    order = {"released": 0, "granted": 1}
    events = [e for e in history.events if e.kind in order]
    for event in sorted(events, key=lambda e: (e.at, order[e.kind])):
        name = event.semaphore
        if event.kind == "released":
            held[name] = held.get(name, 0) - event.count
            continue
        held[name] = held.get(name, 0) + event.count
        maximum = config.semaphores[name].max
        if held[name] > maximum:
            violations.append(
                f"[max] {event.at:.4f}: {name} held {held[name]} > max {maximum} "
                f"(granted {event.count} to {event.who})"
            )
    return violations


def no_lease_lost(history: History, expires_in: float, lease: float) -> list[str]:
    """Every client heartbeats its leases, and a majority can always be reached: no lease may be
    lost, but by a client cut off from every node, or during an outage (every link between nodes
    clogged), within an expiry before; or where two members in a row went down while each acted
    for the slot of the peer's home, within the expiry, and the second stayed down for a lease
    (docs/cluster.md, "What this does not promise": each costs a takeover bound)."""
    failed_in_a_row = _actors_failed_in_a_row(history, expires_in, lease)
    cut_off: dict[str, list[tuple[float, float]]] = {}
    started: dict[str, float] = {}
    for event in history.events:
        if event.kind == "fault" and event.detail.startswith("client_cut"):
            started[event.who] = event.at
        elif event.kind == "healed" and event.detail == "client_cut":
            cut_off.setdefault(event.who, []).append((started.pop(event.who), event.at))
        elif event.kind == "outage" and event.detail == "begins":
            started["*"] = event.at
        elif event.kind == "outage":
            cut_off.setdefault("*", []).append((started.pop("*"), event.at))
    for client, since in started.items():
        cut_off.setdefault(client, []).append((since, float("inf")))

    def excused(event) -> bool:
        client = event.who.split(".")[0]
        return any(
            start <= event.at and end >= event.at - expires_in
            for start, end in cut_off.get(client, []) + cut_off.get("*", [])
        )

    return [
        f"[lease] {e.at:.4f}: {e.who} lost its lease on {e.semaphore}"
        for e in history.events
        if e.kind == "released" and e.detail == "lost" and not (excused(e) or failed_in_a_row(e))
    ]


def _actors_failed_in_a_row(history: History, expires_in: float, lease: float):
    """Whether a lost lease (an event) falls under two failures in a row of the members acting
    for its peer's home slot: within the expiry before it, a member that had gained the slot
    (the last to) crashed, another gained it after and crashed too, before anyone else
    gained it, and that one did not start again within a lease (a new life that asks to recover
    ends its earlier life's leases at once: docs/cluster.md, "A lease ends with its life"). Who
    acted is read from the servers (`Gain`s); down and up from the history."""
    gains: dict[int, list] = defaultdict(list)
    for gain in history.servers.gains:
        gains[gain.slot].append(gain)
    # A member that left resigned its slots first: the next one takes them at once.
    downs = [(e.at, e.who) for e in history.events if e.kind == "down" and e.detail != "left"]
    ups = [(e.at, e.who) for e in history.events if e.kind == "up"]

    def acting_when_down(slot: int, since: float, until: float) -> list[tuple[float, Gain]]:
        failures = []
        for at, node in downs:
            if not since <= at <= until:
                continue
            before = [g for g in gains[slot] if g.at <= at]
            if before and before[-1].life[0] == node:
                failures.append((at, before[-1]))
        return failures

    def failed(event) -> bool:
        grants = [
            e
            for e in history.events
            if e.kind == "granted"
            and (e.who, e.semaphore) == (event.who, event.semaphore)
            and e.at <= event.at
        ]
        if not grants:
            return False
        slot = slot_of(peer_key(grants[-1].peer_id))
        failures = acting_when_down(slot, event.at - expires_in, event.at)
        for first_at, first in failures:
            for second_at, second in failures:
                back = any(
                    node == second.life[0] and second_at < at < second_at + lease
                    for at, node in ups
                )
                if second.life != first.life and first_at < second.at and not back:
                    return True
        return False

    return failed


def tokens_rise(history: History) -> list[str]:
    """Fencing tokens strictly increase per semaphore:

    * of A, in the order the grants were seen (for a semaphore of max 1, holds do not overlap,
      so that is the order they were made in);
    * of every other semaphore, a lock asked for after another was granted gets a larger token
      than that one (the grant was made before the ask, so the counter had passed it);
    * of every semaphore, no two holds share a token.

    A peer asking again for a lock whose release its owner has not heard of yet gets a new lock
    and a new token too (`SemaphoreLeases.request`)."""
    violations = []
    last: dict[str, tuple[int, str]] = {}
    for event in history.events:
        if event.kind != "granted" or event.token is None or event.semaphore != "A":
            continue
        previous = last.get(event.semaphore)
        if previous is not None and event.token <= previous[0]:
            violations.append(
                f"[tokens] {event.at:.4f}: token {event.token} on {event.semaphore} to "
                f"{event.who} after {previous[0]} to {previous[1]}"
            )
        last[event.semaphore] = (event.token, event.who)
    return violations + _tokens_after_grants(history.events)


def _tokens_after_grants(events: list[Event]) -> list[str]:
    violations = []
    asked: dict[tuple[str, str], float] = {}
    # Per semaphore, in the order seen: when each grant was seen, and the largest token granted
    # until then (with its holder).
    seen: dict[str, list[float]] = defaultdict(list)
    largest: dict[str, list[tuple[int, str, float]]] = defaultdict(list)
    holders: dict[tuple[str, int], str] = {}
    for event in events:
        key = (event.who, event.semaphore)
        if event.kind == "asked":
            asked[key] = event.at
            continue
        if event.kind != "granted" or event.token is None or key not in asked:
            continue
        name, since = event.semaphore, asked.pop(key)
        before = bisect.bisect_left(seen[name], since)
        if before and name != "A":  # (A's: in the order granted, above)
            token, who, at = largest[name][before - 1]
            if event.token <= token:
                violations.append(
                    f"[tokens] {event.at:.4f}: token {event.token} on {name} to {event.who} "
                    f"(asked {since:.4f}) after {token} to {who} (granted {at:.4f})"
                )
        top = largest[name][-1] if largest[name] else None
        seen[name].append(event.at)
        largest[name].append(
            top if top is not None and top[0] >= event.token else (event.token, event.who, event.at)
        )
        other = holders.setdefault((name, event.token), event.who)
        if other != event.who:
            violations.append(
                f"[tokens] {event.at:.4f}: token {event.token} on {name} to {event.who}, and "
                f"to {other} before"
            )
    return violations


@dataclass
class _Hold:
    who: str
    token: int
    granted: float
    released: float


def fenced_writes(history: History) -> list[str]:
    """The protected resource (A's holders write to it with their token, some writes arriving
    late) applies a write only if its token is at least the highest applied, so:

    * the tokens it applied never go down, in the order they arrived;
    * a stale write is never applied: one of a holder whose hold ended before another holder
      was granted A, arriving after that later holder's write was applied;
    * no write of the current holder is rejected for a token of an earlier holder (one whose
      hold ended before this one was granted): fencing that refuses the rightful holder.

    The last two need tokens that rise in the order A is granted, across failovers, which is
    what the node promises; the checker judges that end to end, through the resource."""
    holds: dict[tuple[str, int], _Hold] = {}
    open_holds: dict[str, _Hold] = {}
    for event in history.events:
        if event.semaphore != "A":
            continue
        if event.kind == "granted" and event.token is not None:
            hold = _Hold(event.who, event.token, event.at, math.inf)
            open_holds[event.who] = hold
            holds[event.who, event.token] = hold
        elif event.kind == "released" and event.who in open_holds:
            open_holds.pop(event.who).released = event.at
    violations = []
    highest: tuple[int, str] | None = None  # the highest token applied, and its writer
    for event in history.events:
        if event.kind not in ("applied", "rejected"):
            continue
        mine = holds.get((event.who, event.token))
        if highest is not None and mine is not None:
            theirs = holds.get((highest[1], highest[0]))
            if theirs is not None and theirs is not mine:
                if event.kind == "applied" and theirs.granted > mine.released:
                    violations.append(
                        f"[fencing] {event.at:.4f}: a stale write of {event.who} (token "
                        f"{event.token}, held until {mine.released:.4f}) applied after one of "
                        f"{theirs.who} (token {theirs.token}, granted {theirs.granted:.4f})"
                    )
                if event.kind == "rejected" and theirs.released < mine.granted:
                    violations.append(
                        f"[fencing] {event.at:.4f}: a write of {event.who} (token "
                        f"{event.token}, granted {mine.granted:.4f}) rejected for token "
                        f"{theirs.token} of {theirs.who}, whose hold ended at "
                        f"{theirs.released:.4f}"
                    )
        if event.kind == "applied":
            if highest is not None and event.token < highest[0]:
                violations.append(
                    f"[fencing] {event.at:.4f}: token {event.token} applied after {highest[0]}"
                )
            highest = (event.token, event.who)
    return violations


@dataclass
class _Request:
    who: str
    semaphore: str
    count: int
    asked: float
    end: float = math.inf  # granted, refused, or the workload's end
    granted: bool = False


def fifo(history: History, quiet: list[tuple[float, float]]) -> list[str]:
    """Waiters are served strictly in arrival order per semaphore, so a large count is never
    starved by small ones: a lock asked for after another (on the same semaphore) must not be
    granted while that other still waits. Judged where the arrival order at the owner is
    certain: both asked in a quiet time, `APART` apart, and the later one granted in it too."""
    requests: list[_Request] = []
    asking: dict[tuple[str, str], _Request] = {}
    for event in history.events:
        key = (event.who, event.semaphore)
        if event.kind == "asked":
            asking[key] = _Request(event.who, event.semaphore, event.count, event.at)
            requests.append(asking[key])
        elif event.kind in ("granted", "refused") and key in asking:
            request = asking.pop(key)
            request.end, request.granted = event.at, event.kind == "granted"
    by_semaphore: dict[str, list[_Request]] = defaultdict(list)
    for request in requests:
        by_semaphore[request.semaphore].append(request)
    violations = []
    for semaphore, asked in by_semaphore.items():
        for later in asked:
            if not later.granted:
                continue
            for earlier in asked:
                if earlier.asked >= later.asked - APART:
                    break  # in order of asking
                if (
                    earlier.end > later.end + APART
                    and earlier.who != later.who
                    and _within(quiet, earlier.asked, later.end)
                ):
                    violations.append(
                        f"[fifo] {later.end:.4f}: {semaphore} {later.count} granted to "
                        f"{later.who} (asked {later.asked:.4f}) before {earlier.count} to "
                        f"{earlier.who}, waiting since {earlier.asked:.4f}"
                    )
    return violations


def rate_retries_once(history: History, config: NodeConfig) -> list[str]:
    """A rate-limit request that went takes effect once: every later answer to it (the same
    retry id: the client asked again after a lost connection, or the network repeated it) is
    that go, with the same `remaining`. Decided again, a retry would go with less remaining, or
    be sorry. A sorry is judged only for a try sent once the go was answered: one sent earlier
    may have reached the owner first (the client left a stalled node and asked again through
    another, the first try's sorry still on its way), and a retry of a sorry is decided anew.
    Where the promise ends (docs/rate_limits.md, "Retries"), a retry decided anew is a decision
    of its own (`_decisions`)."""
    violations = []
    first_go: dict[tuple[int, str], tuple[int, object]] = {}
    decisions: dict[tuple[int, int], tuple[int, str]] = {}
    for (limiter, _), sends in _group(history.rate).items():
        decisions |= _decisions(sends, per_node=config.rate_limits[limiter].mode == "gossip")
    for send in sorted((s for s in history.rate if s.goes), key=lambda s: s.answered):
        for order, (go, remaining) in enumerate(zip(send.goes, send.remaining, strict=True)):
            decision = decisions[id(send), order]
            first = first_go.get(decision)
            if first is None:
                if go:
                    first_go[decision] = (remaining, send)
                continue
            then = first[1]
            if not go and send.sent < then.answered:
                continue  # maybe decided before the go: a sorry took nothing, and is not kept
            if not go or remaining != first[0]:
                answer = f"go with {remaining} remaining" if go else "sorry"
                violations.append(
                    f"[once] {send.answered:.4f}: {send.client}'s {send.op} of {send.limiter} "
                    f"{send.key!r} went at {then.node} ({then.answered:.4f}, {first[0]} "
                    f"remaining), and its repeat at {send.node} was answered {answer}"
                )
    return violations


def rate_limits(
    history: History, config: NodeConfig, quiet: list[tuple[float, float]]
) -> list[str]:
    """Fixed-window limiters (limit L per aligned window of W seconds; every node agrees on
    the windows). Goes are counted per window when their decision certainly fell in it.

    Exact mode: at most L goes per window and key, whatever fails (a key whose owner failed
    starts spent at its new owner).

    Gossip mode, against docs/rate_limits.md's bound C + rho x t + (N - 1) x (C + rho x (g + d))
    (C = L, and within an aligned window nothing refills, so rho x t drops out):
    * always: at most L goes per window for every node life that ran in it (the (N - 1) x C
      worst case: each life counts its own goes at once, so it alone admits at most L);
    * in quiet times (d = 0): a node admits only while its own goes in the window, and the
      other nodes' goes decided more than g (plus `GOSSIP_SLACK`) before, leave room (each
      node applies a gossiped go when it arrives, within g + d of its decision);
    * and gossip never counts a go twice or invents one: a node's count is at most the goes
      that may have been decided, so a sorry is wrong when those goes, plus its own n, fit
      within L.
    """
    violations = []
    limiters = config.rate_limits
    g = config.cluster.rate_gossip_interval
    lives = _node_lives(history.events)
    sends = history.rate
    clocks = NodeClocks(history.deciders, history.times_of_day)
    for (limiter, key), mine in _group(sends).items():
        settings = limiters[limiter]
        limit, window = settings.limit, settings.window
        if history.times_of_day:
            # Windows fall where each node's clock puts them: exact ones are judged by
            # `rate_exact_by_node_clocks`, gossip ones per life here.
            if settings.mode == "gossip":
                violations += _gossip_by_node_clocks(mine, clocks, limiter, key, settings)
            continue
        certain = _certain_goes(mine, window, per_node=settings.mode == "gossip")
        if settings.mode == "exact":
            for index, goes in sorted(certain.items()):
                start = index * window
                total = sum(go.n for go in goes)
                if total > limit:
                    violations.append(
                        f"[rate-exact] {start + window:.4f}: {limiter} {key!r} admitted "
                        f"{total} > {limit} in the window from {start:.15g} s"
                    )
            continue
        for index, goes in sorted(certain.items()):
            start = index * window
            running = lives(start, start + window)
            total = sum(go.n for go in goes)
            if total > limit * running:
                violations.append(
                    f"[rate-gossip] {start + window:.4f}: {limiter} {key!r} admitted {total} > "
                    f"{limit} x {running} node lives in the window from {start:.15g} s"
                )
            violations += _gossip_known(goes, limiter, key, limit, g, quiet)
        violations += _wrong_sorries(mine, limiter, key, limit, window)
    return violations


def gossip_counted_once(history: History) -> list[str]:
    """Each node counts another node's go event once, however often it arrives (a repeat, or
    a copy that comes later): gossip mode's bound assumes a node knows at most the goes there
    were. Judged where the events are merged (simulations/rate_taps.py), since the clients'
    history cannot tell a sorry said on an event counted twice from one said on a full window."""
    return [
        f"[rate-gossip] {r.at:.4f}: {r.life[0]} counted {r.extra} go event(s) of {r.origin} "
        "more than it had not counted before"
        for r in history.deciders.recounted
    ]


def rate_exact_by_node_clocks(history: History, config: NodeConfig) -> list[str]:
    """Fixed-window limiters in exact mode, judged where each go was decided (the slot's owner
    records it: simulations/rate_taps.py), on the clock it was decided on as the checkers model
    it (simulations/node_clocks.py: the node's time of day without its steps, placed in true
    time), whatever the nodes' times of day read:

    * `[rate-window]` each life admits at most L per window of its own clock;
    * `[rate-handover]` a hand-over keeps the sender's last window: its goes there, and every
      later go by another life until that window ends in true time, add up to at most L
      (docs/cluster.md, "Rate limits in exact mode"). Only hand-overs: a slot taken from a
      crashed owner starts spent until the next window of the new owner's clock, which may
      begin before the old owner's window ends (the run's slot lease, 2 s, is longer than its
      windows, 1 s, so there a takeover comes after it anyway, and no later hand-over of the
      slot is judged against a window of a life before the crash).
    """
    clocks = NodeClocks(history.deciders, history.times_of_day)
    goes: dict[tuple[str, str], list] = defaultdict(list)
    for go in history.deciders.goes:
        goes[go.limiter, go.key].append(go)
    violations = []
    for (limiter, key), mine in sorted(goes.items()):
        settings = config.rate_limits[limiter]
        if settings.algorithm != "fixed_window":
            continue
        counts: dict[tuple, int] = defaultdict(int)
        for go in mine:
            index = clocks.window(go.life, go.at, settings.window)
            if index is not None:
                counts[go.life, index] += go.n
        for (life, index), total in sorted(counts.items()):
            if total > settings.limit:
                end = clocks.window_end(life, index, settings.window)
                violations.append(
                    f"[rate-window] {end:.4f}: {life[0]} (life {life[1]}) admitted {total} > "
                    f"{settings.limit} of {limiter} {key!r} in one window of its clock"
                )
    for taken in history.deciders.taken:
        sender = clocks.life_at(taken.sender, taken.at)
        for limiter, key in sorted(taken.keys):
            settings = config.rate_limits[limiter]
            if sender is None or settings.algorithm != "fixed_window":
                continue
            violations += _handover_kept(clocks, goes[limiter, key], sender, taken, settings)
    return violations


def _handover_kept(clocks: NodeClocks, goes: list, sender, taken, settings) -> list[str]:
    """The sender's last window before the hand-over `taken`, counted in true time to its end,
    holds at most the limit."""
    before = [go for go in goes if go.life == sender and go.at <= taken.at]
    if not before:
        return []
    last = before[-1]
    index = clocks.window(sender, last.at, settings.window)
    if index is None:
        return []
    end = clocks.window_end(sender, index, settings.window)
    own = sum(go.n for go in before if clocks.window(sender, go.at, settings.window) == index)
    after = [go for go in goes if go.life != sender and last.at < go.at < end]
    total = own + sum(go.n for go in after)
    if total <= settings.limit:
        return []
    return [
        f"[rate-handover] {end:.4f}: {taken.sender}'s last window of {last.limiter} "
        f"{last.key!r} before its hand-over to {taken.life[0]} at {taken.at:.4f} held {own}, "
        f"and {total - own} more went elsewhere before it ended: {total} > {settings.limit}"
    ]


def rate_leases(history: History, config: NodeConfig) -> list[str]:
    """Token-bucket limiters in lease mode (capacity C, rate r): the goes clients decided from
    their slices of a key, over any interval from one go to a later one, add up to at most
    C + r x t (docs/rate_limits.md, "Lease mode"), whatever fails. A go is stamped when the
    client decided it, with the clock the nodes decide the bucket on. The first breach of each
    key is named."""
    goes: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for event in history.events:
        if event.kind == "leased":
            goes[event.semaphore, event.detail].append((event.at, event.count))
    violations = []
    for (limiter, key), mine in sorted(goes.items()):
        settings = config.rate_limits[limiter]
        capacity, rate = settings.limit, settings.rate or 0.0
        mine.sort()
        # The most that went from go i to go j, beyond r x (t_j - t_i): the prefix sum up to
        # and with j less r x t_j, against the least of the prefix before i less r x t_i.
        went = 0
        least = (math.inf, 0)  # (prefix before i - r x t_i, i)
        for j, (at, n) in enumerate(mine):
            least = min(least, (went - rate * at, j))
            went += n
            start = mine[least[1]][0]
            beyond = went - rate * at - least[0]
            if beyond > capacity + 1e-6:
                total = went - sum(m for _, m in mine[: least[1]])
                violations.append(
                    f"[rate-lease] {at:.4f}: {limiter} {key!r} admitted {total} from "
                    f"{start:.4f} s, beyond {capacity} + {rate:g} x {at - start:.4f} s"
                )
                break
    return violations


@dataclass(frozen=True)
class _Go:
    node: str
    n: int
    sent: float
    answered: float
    request: int  # which request (of the window's) it answered
    order: int  # position in its request's answer (a check asked `times` times)


def _group(sends) -> dict[tuple[str, str], list]:
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for send in sends:
        groups[send.limiter, send.key].append(send)
    return groups


def _decisions(sends, per_node: bool) -> dict[tuple[int, int], tuple[int, str]]:
    """Which decision each answer of a rate-limit request (by id of its send, and position in
    it) gave or was given: its retry id, and the node that decided it where a retry there is
    decided anew.

    * Gossip mode (`per_node`): every node decides, and only the deciding node remembers.
    * Exact mode: the key's owner remembers, and hands its memory over with the key; when the
      owner fails its memory goes with it. So a go answered with another `remaining` was
      decided anew if the client had given up on one of the two tries while it was unanswered
      (they overlap, the client asked again, maybe more than once, while the first went
      unanswered, or it left the first one's connection before the answer came): the late
      answer was decided by an owner that lost the key before the retry came, and the client
      never took it. Through which node the client asked does not matter: the owner decides,
      whichever node forwards."""
    keys: dict[tuple[int, int], tuple[int, str]] = {}
    first: dict[tuple[int, str], tuple[object, int]] = {}
    # Every try of each retry id, answered or not: when it was sent.
    tries: dict[int, list[float]] = defaultdict(list)
    for send in sends:
        for retry_id in send.retry_ids:
            tries[retry_id].append(send.sent)
    for send in sorted((s for s in sends if s.goes), key=lambda s: s.answered):
        for order, (retry_id, go, remaining) in enumerate(
            zip(send.retry_ids, send.goes, send.remaining, strict=True)
        ):
            key = (retry_id, send.node if per_node else "")
            known = first.get(key)
            if known is not None and not per_node and go and remaining != known[1]:
                then = known[0]
                overlapping = send.sent < then.answered and then.sent < send.answered
                given_up = any(then.sent < sent < then.answered for sent in tries[retry_id]) or (
                    then.given_up is not None and then.given_up < then.answered
                )
                if overlapping or given_up:
                    key = (retry_id, send.node)
                    known = first.get(key)
            if known is None and go:
                first[key] = (send, remaining)
            keys[id(send), order] = key
    return keys


def _certain_goes(sends, window: float, per_node: bool) -> dict[int, list[_Go]]:
    """Goes by window, for those whose request was sent and answered within one window. A
    decision that went (`_decisions`) is counted once, by its first answer
    (`rate_retries_once` checks that its repeats were answered with that go), as decided after
    its first try was sent."""
    windows: dict[int, list[_Go]] = defaultdict(list)
    for send, order, sent in _first_goes(sends, per_node):
        index = math.floor(sent / window)
        if math.floor(send.answered / window) == index:
            windows[index].append(_Go(send.node, send.n, sent, send.answered, id(send), order))
    return windows


def _first_goes(sends, per_node: bool):
    """Each decision that went (`_decisions`), once, by its first answer: (the send answered,
    its position in the answer, when the decision's first try was sent)."""
    decisions = _decisions(sends, per_node)
    first_sent: dict[tuple[int, str], float] = {}
    for send in sends:
        for order, retry_id in enumerate(send.retry_ids):
            decision = decisions.get((id(send), order), (retry_id, send.node if per_node else ""))
            first_sent[decision] = min(send.sent, first_sent.get(decision, send.sent))
    went: set[tuple[int, str]] = set()
    for send in sorted((s for s in sends if s.goes), key=lambda s: s.answered):
        for order, go in enumerate(send.goes):
            decision = decisions[id(send), order]
            if go and decision not in went:
                went.add(decision)
                yield send, order, first_sent[decision]


def _gossip_by_node_clocks(sends, clocks: NodeClocks, limiter: str, key: str, settings):
    """Gossip mode where the nodes' windows differ: each life admits at most L per window of
    its own clock (its own goes alone; what it heard of others only ever makes it admit less).
    A go counts where its decision certainly fell: one life, one window, from its first try's
    sending to its answer."""
    counts: dict[tuple, int] = defaultdict(int)
    for send, _, sent in _first_goes(sends, per_node=True):
        life = clocks.life_at(send.node, sent)
        if life is None or life != clocks.life_at(send.node, send.answered):
            continue
        index = clocks.window(life, sent, settings.window)
        if index is not None and index == clocks.window(life, send.answered, settings.window):
            counts[life, index] += send.n
    return [
        f"[rate-gossip] {clocks.window_end(life, index, settings.window):.4f}: {life[0]} "
        f"(life {life[1]}) admitted {total} > {settings.limit} of {limiter} {key!r} in one "
        "window of its clock"
        for (life, index), total in sorted(counts.items())
        if total > settings.limit
    ]


def _possible_goes(sends, start: float, end: float) -> int:
    """The most that may have been admitted between `start` and `end`: goes that may have
    been decided then, and requests never answered (decided at any time after sending)."""
    total = 0
    for send in sends:
        if send.sent > end:  # (one sent at `end` itself may have been decided by then)
            continue
        if send.answered is None:
            total += send.n * send.times
        elif send.goes and send.answered >= start:
            total += send.n * sum(send.goes)
    return total


def _gossip_known(
    goes: list[_Go],
    limiter: str,
    key: str,
    limit: int,
    g: float,
    quiet: list[tuple[float, float]],
) -> Iterable[str]:
    for go in goes:
        if not _within(quiet, go.sent - g - GOSSIP_SLACK, go.answered):
            continue
        # Its own earlier goes (answered before this was asked, or earlier in the same
        # answer), and the others' that gossip has certainly brought it.
        known = sum(
            other.n
            for other in goes
            if (other.node == go.node and other.answered < go.sent)
            or (other.node != go.node and other.answered < go.sent - g - GOSSIP_SLACK)
            or (other.request == go.request and other.order < go.order)
        )
        if known + go.n > limit:
            yield (
                f"[rate-gossip] {go.answered:.4f}: {go.node} admitted {go.n} of {limiter} "
                f"{key!r} though it knew of {known} of {limit} in the window"
            )


def _wrong_sorries(sends, limiter: str, key: str, limit: int, window: float) -> Iterable[str]:
    answered = sorted((s for s in sends if s.answered is not None), key=lambda s: s.sent)
    sent_at = [s.sent for s in answered]
    unanswered = [s for s in sends if s.answered is None]
    # No request took longer than this to be answered: older ones cannot reach into a window.
    longest = max((s.answered - s.sent for s in answered), default=0.0)
    for send in answered:
        if not send.goes or send.op != "check" or all(send.goes):
            continue
        index = math.floor(send.sent / window)
        if math.floor(send.answered / window) != index:
            continue
        start = index * window
        nearby = answered[
            bisect.bisect_left(sent_at, start - longest) : bisect.bisect_right(
                sent_at, send.answered
            )
        ]
        could_have_gone = _possible_goes(
            [s for s in nearby if s is not send] + unanswered, start, send.answered
        ) + send.n * sum(send.goes)
        if could_have_gone + send.n <= limit:
            yield (
                f"[rate-gossip] {send.answered:.4f}: {send.node} said sorry to {send.n} of "
                f"{limiter} {key!r} though at most {could_have_gone} of {limit} had gone in "
                f"the window from {start:.15g} s"
            )


def _node_lives(events: list[Event]):
    """How many node lives ran at some moment in [start, end)."""
    ups = [e.at for e in events if e.kind == "up"]
    downs = [e.at for e in events if e.kind == "down"]

    def lives(start: float, end: float) -> int:
        return sum(1 for at in ups if at < end) - sum(1 for at in downs if at < start)

    return lives


def committed_writes_survive(servers: ServerLog, since: float = 0.0) -> list[str]:
    """O2 (docs/cluster.md), judged from every node life's records: a write that was committed
    (a quorum held it, so its owner's `CommitGate` let go of what it held back, a client's
    answer among them) is in the state every later owner of its slot gained (`Gained`).

    For each gain under ballot G, the latest committed version (b, v) of any ballot b < G must
    be there: each record it held, as it was, and none it did not hold, but for the keys that
    the gained state holds as a later write (b', v') > (b, v), b' < G, set or dropped them
    (written, maybe not committed, and adopted: allowed).

    A new era (a cold start) begins empty, which is right only when a quorum of the voters
    holds nothing. In a simulation only a minority loses its memory at once, so from the moment
    the cluster was first whole (`since`), a write committed in an earlier era must survive into
    the next too: a gain in a new era without it is a violation, cold or not."""
    violations = []
    by_slot: dict[int, list] = defaultdict(list)
    for writer in servers.writers.values():
        by_slot[writer.slot].append(writer)
    for gain in servers.gains:
        earlier = [w for w in by_slot[gain.slot] if w.ballot < gain.ballot]
        committed = [
            w
            for w in earlier
            if w.committed >= 1 and (w.ballot.era == gain.ballot.era or w.committed_at >= since)
        ]
        if not committed:
            continue
        last = max(committed, key=lambda w: (w.ballot, w.committed))
        state = last.state(last.committed)
        if state is None:
            continue
        # What later writes (b', v') > (b, v), b' < G, said of each key: the gained state
        # may hold any of it instead (None: dropped).
        later: dict[object, set] = defaultdict(set)
        for writer in earlier:
            for write in writer.writes.values():
                if (writer.ballot, write.version) <= (last.ballot, last.committed):
                    continue
                if write.whole:
                    for key in set(state) | set(gain.records):
                        later[key].add(write.records.get(key))
                for key, said in write.records.items():
                    later[key].add(said)
                for key in write.gone:
                    later[key].add(None)
        missing = sorted(
            str(key)
            for key, said in state.items()
            if gain.records.get(key) not in (said, *later[key])
        )
        extra = sorted(
            str(key)
            for key, said in gain.records.items()
            if key not in state and said not in later[key]
        )
        if missing or extra:
            node, life = gain.life
            owner, owner_life = last.life
            what = ", ".join(
                ([f"lacks or differs in {' '.join(missing[:4])}"] if missing else [])
                + ([f"has {' '.join(extra[:4])} it never held"] if extra else [])
            )
            era = "" if last.ballot.era == gain.ballot.era else f", a new era ({gain.ballot.era})"
            violations.append(
                f"[o2] {gain.at:.4f}: slot {gain.slot} gained by {node} (life {life}, ballot "
                f"{gain.ballot.number}{era}) without version {last.committed} of {owner}'s "
                f"ballot {last.ballot.number} (life {owner_life}), committed at "
                f"{last.committed_at:.4f}: {what}"
            )
    return violations
