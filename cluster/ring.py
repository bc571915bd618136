"""Placement: a consistent-hash ring with virtual nodes.

Each member owns `vnodes` points on a 64-bit circle; a key belongs to the first point at or after
its own hash, wrapping around. Hashes come from `hashlib.blake2b` (never Python's `hash()`, which
changes between processes), so every node computes the same owner for the same member set.

Adding or removing a member only moves the keys whose owning point was added or removed: about
1/n of them, and only to or from that member.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable

DEFAULT_VNODES = 128


def stable_hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def semaphore_key(name: str) -> bytes:
    """Ring key of a semaphore (or anything else owned per name)."""
    return b"semaphore/" + name.encode("utf-8", errors="surrogatepass")


def rate_key(limiter: str, key: str) -> bytes:
    """Ring key of one key of a rate limiter: its owner decides for it (exact mode)."""
    return (
        b"rate/"
        + limiter.encode("utf-8", "surrogatepass")
        + b"/"
        + key.encode("utf-8", "surrogatepass")
    )


def peer_key(peer_id: int) -> bytes:
    """Ring key of a peer: its owner is the peer's home node."""
    return b"peer/%d" % peer_id


class Ring:
    """An immutable ring over a set of member ids; build a new one when membership changes."""

    def __init__(self, members: Iterable[str], vnodes: int = DEFAULT_VNODES) -> None:
        if vnodes < 1:
            raise ValueError("a ring needs at least one virtual node per member")
        self.members = frozenset(members)
        self.vnodes = vnodes
        # Ties between points (astronomically unlikely) break by member id, so every node agrees.
        points = sorted(
            (stable_hash(f"{member}#{i}".encode()), member)
            for member in self.members
            for i in range(vnodes)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [m for _, m in points]

    def owner(self, key: bytes) -> str | None:
        """The member owning `key`; None on an empty ring."""
        if not self._hashes:
            return None
        index = bisect.bisect_left(self._hashes, stable_hash(key))
        return self._owners[index % len(self._owners)]

    def preference_list(self, key: bytes, n: int) -> list[str]:
        """The owner of `key` followed by its distinct successors, at most `n` members in all.

        The successors are where replicas live: when the owner goes, the next one takes over.
        """
        if not self._hashes:
            return []
        wanted = min(n, len(self.members))
        start = bisect.bisect_left(self._hashes, stable_hash(key))
        result: list[str] = []
        for step in range(len(self._owners)):
            member = self._owners[(start + step) % len(self._owners)]
            if member not in result:
                result.append(member)
                if len(result) == wanted:
                    break
        return result

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Ring)
            and self.members == other.members
            and self.vnodes == other.vnodes
        )

    def __hash__(self) -> int:
        return hash((self.members, self.vnodes))

    def __repr__(self) -> str:
        return f"Ring({sorted(self.members)!r}, vnodes={self.vnodes})"
