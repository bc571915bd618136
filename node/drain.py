"""Draining a node from afar: `sluicegate drain NODE` asks it, over `POST /drain`, for the
graceful leave SIGTERM starts (every slot resigned to the next owner, rate-limit keys handed
over, a goodbye), after which the node stops.

Only someone who knows the cluster secret may ask. The request carries
`Authorization: Sluicegate-HMAC time=T, proof=P`, P an HMAC-SHA256 under the secret of the node's
id and T (the asker's Unix time): the secret itself never travels, and a proof names one node and
is good for `PROOF_WINDOW` seconds either side of T by the node's clock (a replay within it asks
the same node to drain again, which it already does).

A node refuses (409) to drain when the members left would be no majority of those counted: a
member counted but down keeps counting, and the cluster would stop serving.
"""

from __future__ import annotations

import hashlib
import hmac
import re

import trio

SCHEME = "Sluicegate-HMAC"
PROOF_WINDOW = 60.0
_HEADER = re.compile(rf"{SCHEME} time=(\d{{1,12}}), proof=([0-9a-f]{{64}})")


def drain_proof(secret: bytes, node_id: str, at: int) -> str:
    message = b"sluicegate drain\0" + node_id.encode() + b"\0" + str(at).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def authorization(secret: bytes, node_id: str, at: int) -> str:
    """The `Authorization` header that asks `node_id` to drain, made at Unix time `at`."""
    return f"{SCHEME} time={at}, proof={drain_proof(secret, node_id, at)}"


def refusal(header: str | None, secret: bytes, node_id: str, now: float) -> str | None:
    """Why `header` does not prove the secret for draining this node at Unix time `now`; None if
    it does."""
    if header is None:
        return f"a drain needs the header Authorization: {SCHEME} time=..., proof=..."
    match = _HEADER.fullmatch(header.strip())
    if match is None:
        return f"the Authorization header is not {SCHEME} time=<unix seconds>, proof=<64 hex>"
    at = int(match.group(1))
    if abs(now - at) > PROOF_WINDOW:
        return (
            f"the proof was made {now - at:+.0f} s from now here; it is good for {PROOF_WINDOW:g} s"
        )
    if not hmac.compare_digest(match.group(2), drain_proof(secret, node_id, at)):
        return "the proof does not match this node's cluster secret and id"
    return None


def leaves_a_majority(live: int, counted: int) -> bool:
    """Would the members left, once one live member leaves, be a majority of those counted?"""
    return 2 * (live - 1) > counted - 1


class Drain:
    """What `POST /drain` needs of a cluster node: its id and secret, whether leaving keeps a
    majority, and the event its stopping waits for."""

    def __init__(self, node_id: str, secret: bytes, members, asked: trio.Event) -> None:
        """`members`: the node's `MembershipActor` (live and counted members); `asked` is set
        once a drain is asked."""
        self.node_id = node_id
        self.secret = secret
        self._members = members
        self.asked = asked

    def majority_after(self) -> tuple[bool, int, int]:
        live = len(self._members.live_members())
        counted = len(self._members.known_members())
        return leaves_a_majority(live, counted), live, counted
