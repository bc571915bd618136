"""The sluicegate Python client: `connect` for the async (trio) API (locks and rate limits),
`lock` and `BlockingClient` for threads and scripts."""

from .blocking import BlockingClient, lock
from .client import Client, Lease, connect
from .session import (
    Deadlock,
    LeaseLost,
    LimitReached,
    LockTimeout,
    RateDecision,
    RateLimited,
    RequestRefused,
    SluicegateError,
    Unavailable,
    UnknownLimiter,
    UnknownPeer,
    UnknownSemaphore,
)

__all__ = [
    "BlockingClient",
    "Client",
    "Deadlock",
    "Lease",
    "LeaseLost",
    "LimitReached",
    "LockTimeout",
    "RateDecision",
    "RateLimited",
    "RequestRefused",
    "SluicegateError",
    "Unavailable",
    "UnknownPeer",
    "UnknownLimiter",
    "UnknownSemaphore",
    "connect",
    "lock",
]
