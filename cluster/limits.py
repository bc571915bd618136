"""The bounds on what clients can make a node hold ([limits] in the configuration; README,
"Limits"), and the rules that apply them to an operation.

Two kinds of refusal: `BeyondLimit` for a request that asks for more than any request may (an
expiry of a century, a key of a megabyte), and `QuotaFull` while the node holds as much of
something as it may (peers, waiting acquires, rate-limit keys).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import BeyondLimit, QuotaFull
from .semaphore_ops import Acquire, Heartbeat, NewPeer, Operation, Restore


@dataclass(frozen=True)
class Limits:
    connections: int = 4096
    # Peers whose home is this node.
    peers: int = 100_000
    # Peers one `/ws` connection made that it has not seen the end of.
    peers_per_connection: int = 1_000
    # Acquires of one peer that wait (`block_for`, `wait`) at once.
    waits_per_peer: int = 16
    # Acquires that wait on this node at once, of all its peers.
    waits: int = 20_000
    longest_expires_in: float = 90 * 86_400.0
    longest_block_for: float = 3_600.0
    # The largest count a restore may claim for one lock.
    restore_count: int = 1_000_000
    # Keys one rate limiter keeps on this node, and the longest key.
    rate_limit_keys: int = 100_000
    key_length: int = 256
    # Bytes of an HTTP request body.
    request_size: int = 1024 * 1024

    def admit(self, op: Operation) -> Operation:
        """`op` as the node applies it: refused (`BeyondLimit`) if it asks for an expiry
        longer than `longest_expires_in`, with a `block_for` cut to `longest_block_for`."""
        match op:
            case NewPeer(expires_in) | Heartbeat(_, expires_in) | Restore(_, expires_in):
                self._expiry(expires_in)
            case Acquire(expires_in=expires_in, block_for=block_for):
                if expires_in is not None:
                    self._expiry(expires_in)
                if block_for is not None and block_for > self.longest_block_for:
                    return replace(op, block_for=self.longest_block_for)
        return op

    def make_room_to_wait(self, op: Acquire, of_peer: int, in_all: int) -> None:
        """Refuse (`QuotaFull`) acquire `op` while its peer has `of_peer` acquires waiting and
        the node `in_all`. Past `waits`, only an acquire that may wait (`block_for`) is refused:
        one without is answered as soon as the owner decides."""
        if of_peer >= self.waits_per_peer:
            raise QuotaFull("waits_per_peer", f"peer {op.peer_id} has {of_peer} acquires waiting")
        if op.block_for and op.block_for > 0 and in_all >= self.waits:
            raise QuotaFull("waits", f"this node has {in_all} acquires waiting")

    def _expiry(self, expires_in: float) -> None:
        if expires_in > self.longest_expires_in:
            raise BeyondLimit(
                "longest_expires_in",
                f"expires_in of {expires_in:g} s is longer than {self.longest_expires_in:g} s",
            )


DEFAULT_LIMITS = Limits()
