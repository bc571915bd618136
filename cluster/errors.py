"""Domain errors of the semaphore core.

They carry data, never wire text: the shells (HTTP, and later the WebSocket protocol) map each
type to a status and a body in one place. The names follow Throttle's error kinds one to one.
"""

from __future__ import annotations


class SemaphoreError(Exception):
    """Base of every error a client can cause through the semaphore API."""


class UnknownSemaphore(SemaphoreError):
    def __init__(self, semaphore: str) -> None:
        super().__init__(semaphore)
        self.semaphore = semaphore


class UnknownPeer(SemaphoreError):
    def __init__(self, peer_id: int) -> None:
        super().__init__(peer_id)
        self.peer_id = peer_id


class LockNeverAcquirable(SemaphoreError):
    """The lock asks for more than the semaphore's full count."""

    def __init__(self, asked: int, max: int) -> None:
        super().__init__(asked, max)
        self.asked = asked
        self.max = max


class LockHierarchyViolation(SemaphoreError):
    """Acquiring this lock could deadlock (Throttle's `Deadlock`)."""

    def __init__(self, current: int, requested: int) -> None:
        super().__init__(current, requested)
        self.current = current
        self.requested = requested


class AlreadyPending(SemaphoreError):
    """A peer may wait for one lock at a time."""


class InvalidLockCount(SemaphoreError):
    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


class RestoreConflict(SemaphoreError):
    """A restore tried to change an existing peer (Throttle's `ChangeThroughRestore`)."""


class ShrinkingLockCount(SemaphoreError):
    """Asking again for a lock with a smaller count; Throttle does not implement it, nor do we."""


class StaleOperation(SemaphoreError):
    """A client's operation numbered below one already applied to the peer: a copy that waited
    somewhere while the client went on. It changes nothing."""

    def __init__(self, op: int, applied: int) -> None:
        super().__init__(op, applied)
        self.op = op
        self.applied = applied


class NotServing(SemaphoreError):
    """In a cluster: this node does not serve that peer or semaphore now (it belongs to another
    node, or its state is on its way here). Nothing changed; trying again later works."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotServingCutOff(NotServing):
    """`NotServing`, from a node whose links reach no quorum: it will not serve that soon, and
    a node that forwarded the request there sends its client elsewhere (docs/cluster.md,
    "Routing")."""


class RateLimitError(Exception):
    """Base of every error a client can cause through the rate-limit API."""


class UnknownLimiter(RateLimitError):
    def __init__(self, limiter: str) -> None:
        super().__init__(limiter)
        self.limiter = limiter


class NotLeased(RateLimitError):
    """A slice asked of a rate limiter that is not in lease mode."""

    def __init__(self, limiter: str) -> None:
        super().__init__(f"Rate limiter {limiter!r} is not in lease mode")
        self.limiter = limiter


class InvalidWeight(RateLimitError):
    """A weight below 1, or one the limiter could never admit at once."""

    def __init__(self, weight: int, max_weight: int) -> None:
        super().__init__(weight, max_weight)
        self.weight = weight
        self.max_weight = max_weight


class Forbidden(SemaphoreError, RateLimitError):
    """On a node with tokens: the request's token may not do this (403; cluster/auth.py)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class LimitError(SemaphoreError, RateLimitError):
    """A request past one of the node's limits (`cluster/limits.py`): `limit` names its key in
    `[limits]`, `message` says what was asked or held."""

    code = "limit"
    status = 400

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(limit, message)
        self.limit = limit
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} ([limits] {self.limit})"


class BeyondLimit(LimitError):
    """The request asks for more than any request may (400)."""

    code = "beyond_limit"


class QuotaFull(LimitError):
    """The node holds as much of something as it may; the request would add to it (429)."""

    code = "quota_full"
    status = 429
