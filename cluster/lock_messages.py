"""The messages between a peer's home (`cluster/home.py`) and a semaphore's owner
(`cluster/owner.py`). Every one quotes the lock's ticket (its home's number for it); an owner
ignores a ticket below the latest it knows of the peer, a home one that is not its lock's
(docs/cluster.md, O3). Links deliver them once and in order per pair of lives, and nothing is
sent before what it follows is committed, so each states a fact of committed state.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LockRequest:
    """Home to owner: the peer passed checks 1 to 8; does `count` fit (check 9)?"""

    peer_id: int
    semaphore: str
    count: int
    ticket: int


@dataclass(frozen=True, slots=True)
class LockRestore:
    """Home to owner: the peer holds this lock (its client restored it); count it, even beyond
    max."""

    peer_id: int
    semaphore: str
    count: int
    ticket: int


@dataclass(frozen=True, slots=True)
class LockRelease:
    """Home to owner: the lock of this ticket (or an older one) is released or withdrawn.
    `confirm`: the home waits for `LockReleased` before it answers its client."""

    peer_id: int
    semaphore: str
    ticket: int
    confirm: bool


@dataclass(frozen=True, slots=True)
class LockAnswer:
    """Owner to home: the lock of this ticket is granted (with its fencing token) or waits."""

    peer_id: int
    semaphore: str
    ticket: int
    granted: bool
    token: int


@dataclass(frozen=True, slots=True)
class LockRefused:
    """Owner to home: this node does not act for the semaphore now; nothing changed. The home
    asks again later."""

    peer_id: int
    semaphore: str
    ticket: int


@dataclass(frozen=True, slots=True)
class LockReleased:
    """Owner to home: the release of this ticket is committed, and the grants it caused have
    reached their homes."""

    peer_id: int
    semaphore: str
    ticket: int


@dataclass(frozen=True, slots=True)
class LockTaken:
    """Home to owner: the grant of this ticket arrived (and is committed, or released)."""

    peer_id: int
    semaphore: str
    ticket: int


@dataclass(frozen=True, slots=True)
class Audit:
    """Owner to home: does the peer still want the lock of this ticket (or a later one)? A home
    answers each it does not with `LockRelease`."""

    peer_ids: list[int]
    semaphores: list[str]
    tickets: list[int]


HomeToOwner = LockRequest | LockRestore | LockRelease | LockTaken
OwnerToHome = LockAnswer | LockRefused | LockReleased | Audit
LockMessage = HomeToOwner | OwnerToHome
