"""What an operator asks of a cluster from afar, proving the cluster secret:

* `sluicegate drain NODE` (`POST /drain` to NODE): the graceful leave SIGTERM starts (every slot
  resigned to the next owner, rate-limit keys handed over, a goodbye), after which NODE stops.
  Refused (409) when the members left would be no majority of those counted: a member counted
  but down keeps counting, and the cluster would stop serving.
* `sluicegate forget NODE` (`POST /forget?node=NODE` to any live member): NODE, dead for good,
  stops counting for the quorum (cluster/membership.py `forget`; docs/cluster.md, "Forgetting a
  member"). Refused (409) while NODE is alive, or within `2 × down_after` of another change of
  the members.

The request carries `Authorization: Sluicegate-HMAC time=T, proof=P`, P an HMAC-SHA256 under the
secret of the action, the node it names and T (the asker's Unix time): the secret itself never
travels, and a proof names one action on one node and is good for `PROOF_WINDOW` seconds either
side of T by the node's clock (a replay within it asks for what is being done already).
"""

from __future__ import annotations

import hashlib
import hmac
import re

import trio

from sluicegate.cluster.membership import NotForgotten

SCHEME = "Sluicegate-HMAC"
PROOF_WINDOW = 60.0
_HEADER = re.compile(rf"{SCHEME} time=(\d{{1,12}}), proof=([0-9a-f]{{64}})")


def proof(secret: bytes, action: str, node_id: str, at: int) -> str:
    message = f"sluicegate {action}\0{node_id}\0{at}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def authorization(secret: bytes, action: str, node_id: str, at: int) -> str:
    """The `Authorization` header that asks for `action` ("drain", "forget") on `node_id`, made
    at Unix time `at`."""
    return f"{SCHEME} time={at}, proof={proof(secret, action, node_id, at)}"


def refusal(header: str | None, secret: bytes, action: str, node_id: str, now: float) -> str | None:
    """Why `header` does not prove the secret for `action` on `node_id` at Unix time `now`;
    None if it does."""
    if header is None:
        return f"a {action} needs the header Authorization: {SCHEME} time=..., proof=..."
    match = _HEADER.fullmatch(header.strip())
    if match is None:
        return f"the Authorization header is not {SCHEME} time=<unix seconds>, proof=<64 hex>"
    at = int(match.group(1))
    if abs(now - at) > PROOF_WINDOW:
        return (
            f"the proof was made {now - at:+.0f} s from now here; it is good for {PROOF_WINDOW:g} s"
        )
    if not hmac.compare_digest(match.group(2), proof(secret, action, node_id, at)):
        return f"the proof does not match this cluster's secret for a {action} of {node_id}"
    return None


def leaves_a_majority(live: int, counted: int) -> bool:
    """Would the members left, once one live member leaves, be a majority of those counted?"""
    return 2 * (live - 1) > counted - 1


class ClusterAdmin:
    """What `POST /drain` and `POST /forget` need of a cluster node: its id and secret, its
    members, and the event its stopping waits for."""

    def __init__(self, node_id: str, secret: bytes, members, drain_asked: trio.Event) -> None:
        """`members`: the node's `MembershipActor`; `drain_asked` is set once a drain is
        asked."""
        self.node_id = node_id
        self.secret = secret
        self._members = members
        self.drain_asked = drain_asked

    def majority_after(self) -> tuple[bool, int, int]:
        live = len(self._members.live_members())
        counted = len(self._members.known_members())
        return leaves_a_majority(live, counted), live, counted

    def forget(self, node_id: str) -> NotForgotten | None:
        """Forget a member dead for good; why not, if refused."""
        return self._members.forget(node_id)
