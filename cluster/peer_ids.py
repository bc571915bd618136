"""Peer ids that name the token that made them, on a node with tokens (`[auth]`).

Such an id is 32 random bits beside their 32-bit keyed hash, under a key derived from the
token's secret. Any node that knows the token tells from the id alone whether the peer is the
token's: nothing is recorded or replicated, and a node that restarts still knows. Another token
passes for the peer's maker by one chance in 2**32, and cannot try again for the same peer.
"""

from __future__ import annotations

import hashlib

_LOW = 0xFFFF_FFFF


def key_of(secret: bytes) -> bytes:
    """The key a token's peer ids are made with."""
    return hashlib.blake2b(secret, digest_size=32, person=b"sluicegate peers").digest()


def stamped(key: bytes, draw: int) -> int:
    """The peer id of the random `draw` (its low 32 bits) for the token of `key`."""
    low = draw & _LOW
    return _mac(key, low) << 32 | low


def made_with(key: bytes, peer_id: int) -> bool:
    """Is `peer_id` one made with `key`?"""
    return _mac(key, peer_id & _LOW) == peer_id >> 32


def _mac(key: bytes, low: int) -> int:
    digest = hashlib.blake2b(low.to_bytes(4, "big"), key=key, digest_size=4).digest()
    return int.from_bytes(digest, "big")
