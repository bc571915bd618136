"""The sluicegate Python client: `connect` for the async API (locks and rate limits) under asyncio
or trio, `lock` and `BlockingClient` for threads and scripts. It logs failovers, restores and
lost leases to the logger `sluicegate.client`."""

import logging

from .blocking import BlockingClient, lock
from .client import Client, Lease, connect
from .session import (
    Deadlock,
    Forbidden,
    LeaseLost,
    LimitReached,
    LockTimeout,
    RateDecision,
    RateLimited,
    RequestRefused,
    SluicegateError,
    Unauthorized,
    Unavailable,
    UnknownLimiter,
    UnknownPeer,
    UnknownSemaphore,
)

# Silent unless the application configures logging.
logging.getLogger("sluicegate.client").addHandler(logging.NullHandler())

__all__ = [
    "BlockingClient",
    "Client",
    "Deadlock",
    "Forbidden",
    "Lease",
    "LeaseLost",
    "LimitReached",
    "LockTimeout",
    "RateDecision",
    "RateLimited",
    "RequestRefused",
    "SluicegateError",
    "Unauthorized",
    "Unavailable",
    "UnknownPeer",
    "UnknownLimiter",
    "UnknownSemaphore",
    "connect",
    "lock",
]
