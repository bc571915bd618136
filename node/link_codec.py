"""Every message that travels on node links, with its tag. Tags are forever: never reuse one."""

from __future__ import annotations

from sluicegate.cluster.membership import Gossip, MemberState
from sluicegate.cluster.peers import PeerRecord
from sluicegate.cluster.rate_algorithms import Decision
from sluicegate.cluster.rate_limits import (
    RateCheck,
    RateChecks,
    RateEvent,
    RateEvents,
    RateHandoff,
    RatePull,
    RateState,
    RateStates,
    RateWait,
    RememberedGo,
    Takeover,
)
from sluicegate.cluster.replica_stream import ReplicaDelta, ReplicaResync
from sluicegate.cluster.semaphore_leases import SemaphoreRecord
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
from sluicegate.cluster.shard import (
    Audit,
    Handoff,
    LockAnswer,
    LockRefused,
    LockRelease,
    LockRequest,
    LockRestore,
    Pull,
    Reassert,
)

from .links import HANDSHAKE_MESSAGES
from .rpc import Call, Failure, Reply
from .wire import Codec

LINK_CODEC = Codec(
    {
        1: Gossip,
        2: MemberState,
        3: Call,
        4: Reply,
        5: Failure,
        10: NewPeer,
        11: Heartbeat,
        12: ReleasePeer,
        13: Acquire,
        14: ReleaseLock,
        15: IsAcquired,
        16: Remainder,
        17: Restore,
        18: ListPeers,
        19: AcquireOutcome,
        # 20: retired (whole-state replicas of the interim single authority)
        21: PeerRecord,
        22: SemaphoreRecord,
        23: LockRequest,
        24: LockRestore,
        25: LockRelease,
        26: LockAnswer,
        27: LockRefused,
        28: Audit,
        29: Pull,
        30: Handoff,
        31: Reassert,
        32: ReplicaDelta,
        33: ReplicaResync,
        34: RateCheck,
        35: RateWait,
        36: Decision,
        37: RateEvent,
        38: RateEvents,
        39: RateState,
        40: RateStates,
        41: RateChecks,
        42: RatePull,
        # 43: retired (a hand-over without takeovers)
        44: Takeover,
        45: RateHandoff,
        46: RememberedGo,
        **HANDSHAKE_MESSAGES,
    }
)
