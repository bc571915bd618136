"""The messages of slot ownership (docs/cluster.md, "O1: ballots and leases", "New lives, and
a cold start"), the events `Ownership` reports, and the `Mailbox` its parts send through. Who
sends and answers each message is told in `cluster/acceptor.py`, `cluster/slot_leases.py` and
`cluster/recovery.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .peers import PeerRecord
from .replication import Accept, Accepted, Record
from .semaphore_leases import LockRecord, SemaphoreRecord
from .slots import Ballot

# -- messages -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prepare:
    """`ballot` asks for `slot`; `life`: the sender's life (its generation), which a lease the
    acceptor promises is for."""

    slot: int
    ballot: Ballot
    life: int


@dataclass(frozen=True, slots=True)
class Promise:
    """The acceptor promised `ballot` (and leased the slot to its member): its copy."""

    slot: int
    ballot: Ballot
    accepted: Ballot
    version: int
    records: list[PeerRecord | SemaphoreRecord | LockRecord]


@dataclass(frozen=True, slots=True)
class Refuse:
    """Not `ballot`: the acceptor promised `promised`, or (`lease_left` > 0) leased the slot to
    `lessee` for that many more seconds."""

    slot: int
    ballot: Ballot
    promised: Ballot
    lease_left: float
    lessee: str = ""


@dataclass(frozen=True, slots=True)
class Renew:
    """Round `round` of an owner's leases: extend them for these slots, at its ballots of these
    numbers in `era` (an owner's ballots are its own: their member is the sender), for its life
    `life`; `slow`: its rounds reach a quorum too slowly for it to act for slots
    (cluster/pace.py). A ready member sends its rounds even while it holds no slot, so that the
    others hear that too."""

    round: int
    era: int
    slots: list[int]
    numbers: list[int]
    slow: bool
    life: int


@dataclass(frozen=True, slots=True)
class Renewed:
    """The answer to `Renew`: the slots renewed; the refused ones with the ballot promised; and
    which members asked for the owner's slots in vain since the last answer."""

    round: int
    renewed: list[int]
    refused: list[int]
    promised: list[Ballot]
    wanted: list[int]
    wanted_by: list[str]


@dataclass(frozen=True, slots=True)
class Resign:
    slot: int
    ballot: Ballot


@dataclass(frozen=True, slots=True)
class SlotImage:
    """An acceptor's whole state of one slot, for a recovering life."""

    slot: int
    promised: Ballot
    accepted: Ballot
    version: int
    records: list[PeerRecord | SemaphoreRecord | LockRecord]


@dataclass(frozen=True, slots=True)
class Recover:
    """A new life, `life`, asks for every slot (`nonce` tells its rounds apart)."""

    nonce: int
    life: int


@dataclass(frozen=True, slots=True)
class RecoverReply:
    """Part `part` of `parts` of the answer to `Recover`: whether the sender is ready (and in
    which era), and some of its slots."""

    nonce: int
    ready: bool
    era: int
    images: list[SlotImage]
    part: int
    parts: int


@dataclass(frozen=True, slots=True)
class ColdStart:
    """Proposal: nobody has anything to recover from; start era `proposal.era`."""

    proposal: Ballot


@dataclass(frozen=True, slots=True)
class ColdAnswer:
    """To a `ColdStart`: accepted (the largest proposal the sender accepted is this one), or not
    (`ready`: the sender is ready already; recover from it instead)."""

    proposal: Ballot
    accepted: Ballot
    ready: bool


@dataclass(frozen=True, slots=True)
class ColdStarted:
    """A quorum accepted `proposal`: its acceptors are ready in its era."""

    proposal: Ballot


Message = (
    Prepare
    | Promise
    | Refuse
    | Renew
    | Renewed
    | Resign
    | Accept
    | Accepted
    | Recover
    | RecoverReply
    | ColdStart
    | ColdAnswer
    | ColdStarted
)

# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Gained:
    """This node acts for `slot` from now on (while its lease runs), from `records`; `previous`
    is the ballot of the owner whose state it continues (NO_BALLOT: none); `cold` says the slot
    starts empty in a new era."""

    slot: int
    ballot: Ballot
    previous: Ballot
    records: list[Record]
    cold: bool


@dataclass(frozen=True, slots=True)
class Lost:
    """This node acts for `slot` no more under `ballot` (its lease ran out, it resigned, or
    another owner has a larger ballot)."""

    slot: int
    ballot: Ballot
    resigned: bool


@dataclass(frozen=True, slots=True)
class Ready:
    """This life answers as an acceptor from now on; `cold`: it started a new era, empty."""

    era: int
    cold: bool


Event = Gained | Lost | Ready


class Mailbox:
    """Where this node's messages go: to the others through `outbox`, to itself through `local`
    (handled once the input that sent them is), in the order they were sent."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.outbox: list[tuple[str, Message]] = []
        self.local: list[Message] = []

    def send(self, member: str, message: Message) -> None:
        if member == self.me:
            self.local.append(message)
        else:
            self.outbox.append((member, message))

    def to_all(self, members: Iterable[str], message: Message) -> None:
        for member in sorted(members):
            self.send(member, message)
