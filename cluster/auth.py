"""Who may do what on a node with tokens (`[auth]`; README, "Security").

A token is a name, a secret and its scopes: the semaphores and the rate limiters it may use (glob
patterns), whether it may change anything (`read_only`), and whether it may look at the whole
node (`admin`). A request names its token (`Credentials.from_header`, `Credentials.from_secret`),
and each operation it makes is held against the token's scopes (`refusal`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import TypeVar

from .errors import Forbidden
from .peer_ids import key_of, made_with
from .rate_limits import RateCheck, RateChecks, RateLease, RateWait
from .semaphore_ops import (
    Acquire,
    Heartbeat,
    IsAcquired,
    ListPeers,
    NewPeer,
    ReleaseLock,
    ReleasePeer,
    Remainder,
    Restore,
)

# The shortest secret a token may have, as for the cluster's.
SHORTEST_SECRET = 16
# The routes that tell about a node rather than act on it: anyone may use them unless the node
# says otherwise (`[auth] open`).
INFO_ROUTES = ("/", "/health", "/ready", "/version", "/favicon.ico", "/metrics")

T = TypeVar("T")


@dataclass(frozen=True)
class Token:
    name: str
    secret: bytes = field(repr=False)
    semaphores: tuple[str, ...] = ("*",)
    rate_limits: tuple[str, ...] = ("*",)
    read_only: bool = False
    admin: bool = False
    # What the ids of the token's peers are made with (cluster/peer_ids.py).
    peer_key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "peer_key", key_of(self.secret))

    def owns(self, peer_id: int) -> bool:
        """May the token act on this peer: did it make it, or is it an admin?"""
        return self.admin or made_with(self.peer_key, peer_id)


# Each operation: whether it changes anything, and the scope its names are held against.
_WRITES = {
    NewPeer: True,
    Heartbeat: True,
    ReleasePeer: True,
    Acquire: True,
    ReleaseLock: True,
    Restore: True,
    IsAcquired: False,
    Remainder: False,
    ListPeers: False,
    RateCheck: True,
    RateChecks: True,
    RateWait: True,
    RateLease: True,
}


def _names(op: object) -> tuple[str, tuple[str, ...]]:
    """The scope an operation's names fall under, and the names."""
    if isinstance(op, Acquire | ReleaseLock | Remainder):
        return "semaphores", (op.semaphore,)
    if isinstance(op, Restore):
        return "semaphores", tuple(op.acquired)
    if isinstance(op, RateCheck | RateChecks | RateWait | RateLease):
        return "rate_limits", (op.limiter,)
    return "", ()


def admit(token: Token, op: T) -> T:
    """`op` as `token` makes it (a new peer's id names the token), or `Forbidden` if the token
    may not: a change with a read-only token, a name outside its scopes, or a peer that another
    token made."""
    if _WRITES[type(op)] and token.read_only:
        raise Forbidden(f"the token {token.name!r} is read-only")
    scope, names = _names(op)
    for name in names:
        if not any(fnmatchcase(name, pattern) for pattern in getattr(token, scope)):
            kind = "semaphore" if scope == "semaphores" else "rate limiter"
            raise Forbidden(f"the token {token.name!r} may not use the {kind} {name!r}")
    if isinstance(op, NewPeer):
        return replace(op, key=token.peer_key)
    peer_id = getattr(op, "peer_id", None)
    if peer_id is not None and not token.owns(peer_id):
        raise Forbidden(f"the peer {peer_id} is not one the token {token.name!r} made")
    return op


class Credentials:
    """The tokens a node knows. Secrets are compared in constant time, by their digests (so not
    even their lengths show)."""

    def __init__(self, tokens: Iterable[Token], open_routes: Iterable[str] = INFO_ROUTES) -> None:
        """`open_routes`: those of `INFO_ROUTES` anyone may use without a token."""
        self.tokens = tuple(tokens)
        self.open_routes = frozenset(open_routes)
        self._digests = [(hashlib.sha256(t.secret).digest(), t) for t in self.tokens]

    def from_secret(self, secret: bytes | str | None) -> Token | None:
        """The token whose secret this is, if any."""
        if secret is None:
            return None
        if isinstance(secret, str):
            secret = secret.encode()
        digest = hashlib.sha256(secret).digest()
        found = None
        for known, token in self._digests:
            if hmac.compare_digest(known, digest):
                found = token
        return found

    def from_header(self, header: bytes | None) -> Token | None:
        """The token an `Authorization` header names: `Bearer SECRET`, or `Basic` with the
        token's name and secret (a URL's `http://name:secret@host`); None if none does."""
        if header is None:
            return None
        scheme, _, value = header.strip().partition(b" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == b"bearer":
            return self.from_secret(value)
        if scheme != b"basic":
            return None
        try:
            name, colon, secret = base64.b64decode(value, validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return None
        token = self.from_secret(secret) if colon else None
        return token if token is not None and token.name.encode() == name else None
