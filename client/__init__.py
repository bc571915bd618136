"""The sluicegate Python client: `connect` for the async (trio) API, `lock` and `BlockingClient`
for threads and scripts."""

from .blocking import BlockingClient, lock
from .client import Client, Lease, connect
from .session import (
    Deadlock,
    LeaseLost,
    LockTimeout,
    RequestRefused,
    SluicegateError,
    Unavailable,
    UnknownPeer,
    UnknownSemaphore,
)

__all__ = [
    "BlockingClient",
    "Client",
    "Deadlock",
    "Lease",
    "LeaseLost",
    "LockTimeout",
    "RequestRefused",
    "SluicegateError",
    "Unavailable",
    "UnknownPeer",
    "UnknownSemaphore",
    "connect",
    "lock",
]
