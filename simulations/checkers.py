"""Invariant checkers: each reads the history the clients recorded and names what went wrong.

Client-observed holds are inside the real ones (a grant is seen after the owner made it, and a
release is sent after the client stopped using the lock), so any overlap seen here happened at
the owner too.
"""

from __future__ import annotations

from sluicegate.node.config import NodeConfig

from .history import History


def check_history(history: History, config: NodeConfig, expires_in: float) -> list[str]:
    return [
        *never_more_than_max(history, config),
        *no_lease_lost(history, expires_in),
        *tokens_rise(history),
        *[f"{e.at:.4f}: {e.detail}" for e in history.events if e.kind == "stuck"],
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


def no_lease_lost(history: History, expires_in: float) -> list[str]:
    """Every client heartbeats its leases, and one node fails at a time, so the majority can
    always be reached: no lease may be lost, but by a client cut off from every node within an
    expiry before."""
    cut_off: dict[str, list[tuple[float, float]]] = {}
    started: dict[str, float] = {}
    for event in history.events:
        if event.kind == "fault" and event.detail.startswith("client_cut"):
            started[event.who] = event.at
        elif event.kind == "healed" and event.detail == "client_cut":
            cut_off.setdefault(event.who, []).append((started.pop(event.who), event.at))
    for client, since in started.items():
        cut_off.setdefault(client, []).append((since, float("inf")))

    def excused(event) -> bool:
        client = event.who.split(".")[0]
        return any(
            start <= event.at and end >= event.at - expires_in
            for start, end in cut_off.get(client, ())
        )

    return [
        f"{e.at:.4f}: {e.who} lost its lease on {e.semaphore}"
        for e in history.events
        if e.kind == "released" and e.detail == "lost" and not excused(e)
    ]


def tokens_rise(history: History) -> list[str]:
    """Fencing tokens strictly increase per semaphore, in the order the grants were seen (for a
    semaphore of max 1, holds do not overlap, so that is the order they were made in). A peer
    asking again for a lock whose release its owner has not heard of yet gets a new lock and a
    new token too (`SemaphoreLeases.request`)."""
    violations = []
    last: dict[str, tuple[int, str]] = {}
    for event in history.events:
        if event.kind != "granted" or event.token is None or event.semaphore != "A":
            continue
        previous = last.get(event.semaphore)
        if previous is not None and event.token <= previous[0]:
            violations.append(
                f"{event.at:.4f}: token {event.token} on {event.semaphore} to {event.who} "
                f"after {previous[0]} to {previous[1]}"
            )
        last[event.semaphore] = (event.token, event.who)
    return violations
