"""Every message that travels on node links, with its tag. Tags are forever: never reuse one."""

from __future__ import annotations

from sluicegate.cluster.departures import Claim
from sluicegate.cluster.lock_messages import (
    Audit,
    LockAnswer,
    LockRefused,
    LockRelease,
    LockReleased,
    LockRequest,
    LockRestore,
    LockTaken,
)
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
from sluicegate.cluster.rate_algorithms import Decision
from sluicegate.cluster.rate_limits import (
    RateCheck,
    RateChecks,
    RateEvent,
    RateEvents,
    RateHandover,
    RateLease,
    RateState,
    RateStates,
    RateWait,
    RememberedGo,
    SlotRates,
)
from sluicegate.cluster.replication import Accept, Accepted
from sluicegate.cluster.semaphore_leases import LockRecord, SemaphoreRecord
from sluicegate.cluster.semaphore_ops import (
    Acquire,
    AcquireOutcome,
    Heartbeat,
    IsAcquired,
    ListPeers,
    NewPeer,
    ReleaseLock,
    ReleasePeer,
    Remainder,
    Restore,
)
from sluicegate.cluster.slots import Ballot

from .links import HANDSHAKE_MESSAGES
from .rpc import Call, Failure, Reply
from .wire import Codec

# Retired tags, never to be used again: 12-14, 17 (peer operations before they were numbered);
# 20-33 (replicas streamed to every member, and the home and owner messages of that design);
# 42-45 (rate-limit pulls, hand-offs and takeovers by failed member); 67-68 (a semaphore's
# record with every lock in it); 39, 78 (rate-limit states that carried the sender's times, now
# offsets from their sending: 85-86); 84 (gossiped events by age); 2 (a member's entry before it
# carried its marks of departures: 87).
LINK_CODEC = Codec(
    {
        1: Gossip,
        3: Call,
        4: Reply,
        5: Failure,
        10: NewPeer,
        11: Heartbeat,
        15: IsAcquired,
        16: Remainder,
        18: ListPeers,
        19: AcquireOutcome,
        34: RateCheck,
        35: RateWait,
        36: Decision,
        37: RateEvent,
        38: RateEvents,
        40: RateStates,
        41: RateChecks,
        46: RememberedGo,
        47: ReleasePeer,
        48: Acquire,
        49: ReleaseLock,
        50: Restore,
        51: Ballot,
        52: Prepare,
        53: Promise,
        54: Refuse,
        55: Renew,
        56: Renewed,
        57: Resign,
        58: SlotImage,
        59: Recover,
        60: RecoverReply,
        61: ColdStart,
        62: ColdAnswer,
        63: ColdStarted,
        64: Accept,
        65: Accepted,
        66: PeerRecord,
        69: LockRequest,
        70: LockRestore,
        71: LockRelease,
        72: LockAnswer,
        73: LockRefused,
        74: LockReleased,
        75: LockTaken,
        76: Audit,
        77: RateHandover,
        79: LockRecord,
        80: SemaphoreRecord,
        81: RateLease,
        82: SliceReport,
        83: Grant,
        85: RateState,
        86: SlotRates,
        87: MemberState,
        88: Claim,
        **HANDSHAKE_MESSAGES,
    }
)
