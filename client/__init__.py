"""The sluicegate Python client: `connect` for the async (trio) API."""

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
]
