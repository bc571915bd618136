"""What a client knows, without any I/O: its peer, the locks it holds and waits for, the requests
in flight, and what to tell a node that forgot it.

The connection (`client/connection.py`) sends what this builds and feeds back what arrives. The
rules here decide, for instance, that a lock is held only once a node said so, and that a peer
the cluster forgot is restored with exactly the locks held, never the ones still waited for.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import NamedTuple


class SluicegateError(Exception):
    """Base of the client's errors; `code` is the protocol's error code."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)


class UnknownSemaphore(SluicegateError):
    code = "unknown_semaphore"


class UnknownPeer(SluicegateError):
    code = "unknown_peer"


class Deadlock(SluicegateError):
    """The lock's level would break the hierarchy of the locks held (it could deadlock)."""

    code = "deadlock"


class Unavailable(SluicegateError):
    """No node could serve the request (all unreachable, joining, or without a majority)."""

    code = "unavailable"
    # From a node that reaches a quorum: how long its 503s may go on before it serves.
    retry_here_for = 0.0


class LockTimeout(SluicegateError):
    """The lock was not granted within the timeout."""

    code = "timeout"


class LeaseLost(SluicegateError):
    """A held lock could not be kept: its peer expired before a heartbeat reached a node."""

    code = "lease_lost"


class UnknownLimiter(SluicegateError):
    code = "unknown_limiter"


class RateLimited(SluicegateError):
    """`rate_limited` was not admitted within its timeout."""

    code = "rate_limited"


class LimitReached(SluicegateError):
    """The node refused past one of its limits (`quota_full` or `beyond_limit`, README,
    "Limits"); the message names the limit."""

    code = "quota_full"


class Unauthorized(SluicegateError):
    """The node needs a token, and the client's is none it knows (its hello was refused)."""

    code = "unauthorized"


class Forbidden(SluicegateError):
    """The client's token may not do this (a semaphore or rate limiter outside its scopes, or a
    change with a read-only token)."""

    code = "forbidden"


class RequestRefused(SluicegateError):
    """Any other refusal of the protocol (bad request, never acquirable, already pending...)."""


_ERRORS: dict[str, type[SluicegateError]] = {
    cls.code: cls
    for cls in (
        UnknownSemaphore,
        UnknownPeer,
        Deadlock,
        Unavailable,
        LeaseLost,
        UnknownLimiter,
        Forbidden,
    )
}
_ERRORS["quota_full"] = _ERRORS["beyond_limit"] = LimitReached


def error_from(answer: dict) -> SluicegateError:
    cls = _ERRORS.get(answer.get("error") or "", RequestRefused)
    error = cls(answer.get("message") or answer.get("error") or "refused")
    error.code = answer.get("error", cls.code)
    retry_here_for = answer.get("retry_here_for")
    if isinstance(error, Unavailable) and isinstance(retry_here_for, int | float):
        error.retry_here_for = float(retry_here_for)
    return error


class RateDecision(NamedTuple):
    """A rate limiter's answer: `go`, how much `remaining` right after it, and (a sorry) the
    seconds until the same request could go."""

    go: bool
    remaining: int
    retry_after: float

    @classmethod
    def from_answer(cls, answer: dict) -> RateDecision:
        return cls(answer["go"], answer["remaining"], answer["retry_after"])


@dataclass
class Held:
    count: int
    token: int | None


@dataclass
class Peer:
    """One peer of the client: a lock hierarchy (the locks one task holds, nested)."""

    peer_id: int
    held: dict[str, Held] = field(default_factory=dict)
    # The cluster may count a lock of this peer that the client does not: a release or a
    # withdrawal was not confirmed, or its leases were lost. It is not reused.
    unsettled: bool = False
    # When the request that last set its expiry at a node (created, restored, heartbeat) was
    # sent: the node counts the expiry from a later moment, so the peer lives at least until
    # `renewed_at + expires_in`.
    renewed_at: float = -math.inf
    # When each heartbeat of it on its way was sent (several, when answers take longer than a
    # beat).
    heartbeats_sent: list[float] = field(default_factory=list)
    # The number of the last operation on it that changes its locks: each new one gets the next
    # (a retry keeps its own), so a node refuses a copy that waited somewhere as stale.
    ops: int = 0


class Session:
    """The client's peers and request ids. A task's outermost lock takes a peer (a new one, or
    an idle one of this client's); its nested locks use the same peer, so the cluster checks
    their levels; afterwards the peer goes back to the idle ones."""

    def __init__(self, expires_in: float) -> None:
        self.expires_in = expires_in
        self.peers: dict[int, Peer] = {}
        self._idle: list[Peer] = []
        self._ids = itertools.count(1)

    def request(self, op: str, **fields: object) -> dict:
        """A request map with a fresh id (fields that are None are left out)."""
        request = {"id": next(self._ids), "op": op}
        request.update({k: v for k, v in fields.items() if v is not None})
        return request

    def new_peer(self) -> dict:
        return self.request("new_peer", expires_in=self.expires_in)

    def heartbeat(self, peer: Peer) -> dict:
        return self.request("heartbeat", peer=peer.peer_id, expires_in=self.expires_in)

    def remainder(self, semaphore: str) -> dict:
        return self.request("remainder", semaphore=semaphore)

    def created(self, peer_id: int, sent_at: float) -> Peer:
        peer = self.peers[peer_id] = Peer(peer_id, renewed_at=sent_at)
        return peer

    def renewed(self, peer: Peer, sent_at: float) -> None:
        """A request sent at `sent_at` set the peer's expiry (a heartbeat, a restore)."""
        peer.renewed_at = max(peer.renewed_at, sent_at)

    def expires_at(self, peer: Peer) -> float:
        """The peer lives at least until then; after it, a node may have expired it."""
        return peer.renewed_at + self.expires_in

    def idle_peer(self) -> Peer | None:
        return self._idle.pop() if self._idle else None

    def put_back(self, peer: Peer) -> None:
        """A task's outermost lock is over: its peer may serve another task, unless a release
        of it is unsettled; then it is dropped (no more heartbeats: it expires, and the
        cluster frees whatever it still counts)."""
        if peer.peer_id not in self.peers:
            return
        if peer.unsettled:
            del self.peers[peer.peer_id]
        elif not peer.held:
            self._idle.append(peer)

    def restore(self, peer: Peer) -> dict:
        """What recreates `peer` at a node that forgot it: exactly the locks it holds, as of
        its last operation (a retry of that one may follow)."""
        acquired = {name: held.count for name, held in peer.held.items()}
        return self.request(
            "restore",
            peer=peer.peer_id,
            expires_in=self.expires_in,
            acquired=acquired,
            seq=peer.ops or None,
        )

    @staticmethod
    def next_op(peer: Peer) -> int:
        """The number of a new operation on `peer`'s locks."""
        peer.ops += 1
        return peer.ops

    # The two requests of every lock, built directly (the hot path).

    def acquire(self, peer: Peer, semaphore: str, count: int, wait: float | None, seq: int) -> dict:
        request = {
            "id": next(self._ids),
            "op": "acquire",
            "peer": peer.peer_id,
            "semaphore": semaphore,
            "count": count,
            "expires_in": self.expires_in,
            "seq": seq,
        }
        if wait is not None:
            request["wait"] = wait
        return request

    def release(self, peer: Peer, semaphore: str, seq: int) -> dict:
        return {
            "id": next(self._ids),
            "op": "release",
            "peer": peer.peer_id,
            "semaphore": semaphore,
            "seq": seq,
        }

    def check(self, limiter: str, key: str, n: int, retry_id: int) -> dict:
        """A rate-limit check; `retry_id` the same on every try of it (a retry after a lost
        connection gets the go the first try got, rather than another)."""
        request = {"id": next(self._ids), "op": "check", "limiter": limiter, "retry_id": retry_id}
        # The defaults (no key, a weight of 1) are left out: smaller frames, both ways cheaper.
        if key:
            request["key"] = key
        if n != 1:
            request["n"] = n
        return request

    def lease(
        self, limiter: str, key: str, holder: int, reports: list[list], want: int, ask_id: int
    ) -> dict:
        """An ask for a slice of a lease-mode key; `ask_id` the same on every try of it."""
        return {
            "id": next(self._ids),
            "op": "lease",
            "limiter": limiter,
            "key": key,
            "holder": holder,
            "reports": reports,
            "want": want,
            "ask_id": ask_id,
        }

    def wait(self, limiter: str, key: str, n: int, timeout: float, retry_id: int) -> dict:
        request = self.check(limiter, key, n, retry_id)
        request.update(op="wait", timeout=timeout)
        return request

    def acquired(self, peer: Peer, semaphore: str, count: int, result: dict) -> bool:
        """An acquire's answer: True (and held from now on) if granted."""
        if result.get("acquired"):
            peer.held[semaphore] = Held(count, result.get("token"))
            return True
        return False

    def released(self, peer: Peer, semaphore: str) -> None:
        peer.held.pop(semaphore, None)

    def lost(self, peer: Peer) -> None:
        """The peer's leases are lost (it may have expired): it holds nothing the client knows
        of, and is not reused. A node may still count it, with a lock its task asked for and
        gave up on (not withdrawn: a lost lease ends its task's locks at once)."""
        peer.held.clear()
        peer.unsettled = True
