"""The node links' codec (node/link_codec.py) carries every message of slot ownership and quorum
writes, and a forwarded ask for a slice, and gives back what was sent."""

from __future__ import annotations

from sluicegate.cluster.departures import EVERY_SLOT, SLOT_BYTES, Claim
from sluicegate.cluster.membership import Gossip, MemberState
from sluicegate.cluster.ownership import (
    ColdAnswer,
    ColdStart,
    ColdStarted,
    Prepare,
    Promise,
    Recover,
    RecoverReply,
    Refuse,
    Renew,
    Renewed,
    Resign,
    SlotImage,
)
from sluicegate.cluster.peers import PeerRecord
from sluicegate.cluster.quota_leases import Grant, SliceReport
from sluicegate.cluster.rate_limits import RateLease
from sluicegate.cluster.replication import Accept, Accepted
from sluicegate.cluster.semaphore_leases import LockRecord, SemaphoreRecord
from sluicegate.cluster.slots import NO_BALLOT, Ballot
from sluicegate.node.link_codec import LINK_CODEC
from sluicegate.node.rpc import Call, Reply


def record(key: int) -> PeerRecord:
    return PeerRecord(key, 60.0, 60.0, {}, None, 0, {}, {}, 1, 0)


def test_every_ownership_message_crosses_a_node_link():
    ballot = Ballot(1_700_000_000_000, 7, "n2")
    semaphore = SemaphoreRecord("A", 9, 2)
    holder, waiter = LockRecord("A", 5, 1, 2, 8, False, 0), LockRecord("A", 6, 1, 3, 0, True, 1)
    messages = [
        Prepare(3, ballot, 1_764_000_000_000_000_000),
        Promise(3, ballot, NO_BALLOT, 0, [record(5), semaphore, holder, waiter]),
        Refuse(3, ballot, ballot, 0.25),
        Renew(4, ballot.era, [1, 2], [7, 8], False, 1_764_000_000_000_000_000),
        Renewed(4, [1], [2], [ballot], [1], ["n3"]),
        Resign(3, ballot),
        Accept(3, ballot, 2, False, [record(5), waiter], [6, "s:B", holder.key]),
        Accepted(3, ballot, 2),
        Recover(11, 1_764_000_000_000_000_000),
        RecoverReply(11, True, ballot.era, [SlotImage(3, ballot, ballot, 2, [semaphore])], 0, 1),
        ColdStart(ballot),
        ColdAnswer(ballot, ballot, False),
        ColdStarted(ballot),
    ]
    assert LINK_CODEC.decode(LINK_CODEC.encode(messages)) == messages


def test_a_forwarded_ask_for_a_slice_and_its_grant_cross_a_node_link():
    reports = (SliceReport(1 << 50, 3), SliceReport((1 << 50) + 1, 0, closed=True))
    messages = [
        Call(7, RateLease("fetch", "tenant", 2**63 - 1, reports, 40, 2**64 - 1)),
        Reply(7, Grant(1 << 50, 40, 0.998)),
        Reply(8, Grant(0, 0, 0.0, retry_after=0.25)),
    ]
    assert LINK_CODEC.decode(LINK_CODEC.encode(messages)) == messages


def test_a_members_claims_of_every_slot_cross_a_link():
    """A departure's marks (cluster/departures.py) are a bit per slot: more than a wire's
    integer holds, so they go as bytes."""
    every = EVERY_SLOT.to_bytes(SLOT_BYTES, "little")
    gossip = Gossip("a", (MemberState("a", "a:1", 1, 2, settled=(Claim("f", 7, every),)),))
    assert LINK_CODEC.decode(LINK_CODEC.encode([gossip])) == [gossip]
