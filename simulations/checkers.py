"""Invariant checkers: each reads the history the clients recorded and names what went wrong.

Client-observed holds are inside the real ones (a grant is seen after the owner made it, and a
release is sent after the client stopped using the lock), so any overlap seen here happened at
the owner too.
"""

from __future__ import annotations

from sluicegate.node.config import NodeConfig

from .history import History


def check_history(history: History, config: NodeConfig) -> list[str]:
    return [
        *never_more_than_max(history, config),
        *no_lease_lost(history),
        *tokens_rise(history),
    ]


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
                f"{event.at:.4f}: {name} held {held[name]} > max {maximum} "
                f"(granted {event.count} to {event.who})"
            )
    return violations


def no_lease_lost(history: History) -> list[str]:
    """Every client heartbeats its leases: none may be lost."""
    return [
        f"{e.at:.4f}: {e.who} lost its lease on {e.semaphore}"
        for e in history.events
        if e.kind == "released" and e.detail == "lost"
    ]


def tokens_rise(history: History) -> list[str]:
    """Fencing tokens strictly increase per semaphore, in the order the grants were seen (for a
    semaphore of max 1, holds do not overlap, so that is the order they were made in).

    One exception: the same peer again with the same token. Its release was accepted by its
    home but had not reached the owner when it asked again, so the owner kept the one lock it
    had (`SemaphoreLeases.request`: a request of the count held takes the new ticket): one
    grant there, two here, and nobody else in between."""
    violations = []
    last: dict[str, tuple[int, int, str]] = {}
    for event in history.events:
        if event.kind != "granted" or event.token is None or event.semaphore != "A":
            continue
        previous = last.get(event.semaphore)
        if previous is not None and event.token <= previous[0]:
            if not (event.token == previous[0] and event.peer_id == previous[1]):
                violations.append(
                    f"{event.at:.4f}: token {event.token} on {event.semaphore} to {event.who} "
                    f"after {previous[0]} to {previous[2]}"
                )
        last[event.semaphore] = (event.token, event.peer_id, event.who)
    return violations
