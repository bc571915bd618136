"""Ownership of slots: which life acts for each slot, and how that changes hands
(docs/cluster.md, invariants O1 and O2). Semaphores and rate limits both go through it.

Every node is an *acceptor* for every slot: it keeps the largest ballot it promised, its copy of
the slot (`SlotCopy`), and at most one running *lease promise* (a member, a ballot, until when by
its clock). A member the ring names for a slot *takes* it:

1. `Prepare(ballot)` to every voter. An acceptor promises (`Promise`, with its copy) if the
   ballot is above its promise and no lease it gave another member runs; that answer is a lease
   to the preparer too. Otherwise `Refuse`, saying why.
2. With promises from a quorum (and from the slot's previous owner, if it is alive: what it hands
   over travels on the same link, ahead of its promise), the new owner adopts the copy with the
   largest (ballot, version) and writes it whole under its own ballot.
3. Once that write is committed, the slot is *gained*: the owner acts on it while its lease runs,
   until `sent + lease × (1 − DRIFT) / (1 + DRIFT)` of its clock, where `sent` is when it sent
   the last `Prepare` or `Renew` a quorum confirmed. It renews every `lease / 4`.

An owner *loses* a slot when its lease runs out (one acceptor's refusal does not end it while a
quorum renews). It *resigns* a slot when its ring names another member that a quorum of
acceptors reports as wanting it (refused for the lease): it stops first, then `Resign` ends
the lease promises, so the next owner need not wait them out. A member that cannot reach a
quorum never gets a slot resigned to it.

Writes (`write`) go to every voter; `CommitGate` holds back what depends on them.

**A new life** answers as an acceptor only once it has (a) waited out the leases its previous
life may have promised and (b) *recovered*: read every slot from enough other voters that are
ready to share a member with every quorum its previous life was in (n − q + 1 of the n voters,
q a quorum), keeping the largest copy and promise of each. When a quorum of voters has nothing to
read from (a cold start), one of them proposes a new *era* (`ColdStart`); not-ready members
accept the largest proposal, ready ones refuse it, and a proposal a quorum accepted makes its
acceptors ready in that era, empty. Decisions about recovery wait `settle` seconds from the
start, to learn the voters first, unless the membership heard from every member it knows of
(`knows_the_voters`). The ring that names who takes each slot leaves out the
members that are recovering (a `Recover` or `ColdStart` from them says so, until a message only
a ready life sends): a member back from a crash before its old leases ran out would otherwise
keep its slots from everyone until its own recovery ends, a lease and more later.

Pure: `now` comes in; messages go out through `outbox()`, slot changes through `events()`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from .peers import PeerRecord
from .replication import PART_RECORDS, Accept, Accepted, CommitGate, Record, SlotCopy, SlotWriter
from .replication import quorum as quorum_of
from .ring import Ring
from .semaphore_leases import LockRecord, SemaphoreRecord
from .slots import DRIFT, NO_BALLOT, SLOTS, Ballot, slot_owners

# A recovering life asks again this often.
RECOVER_RETRY = 0.5

# -- messages -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prepare:
    slot: int
    ballot: Ballot


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
    numbers in `era` (an owner's ballots are its own: their member is the sender)."""

    round: int
    era: int
    slots: list[int]
    numbers: list[int]


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
    """A new life asks for every slot (`nonce` tells its rounds apart)."""

    nonce: int


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

# What a message says of its sender: True, its life is recovering (it answers as no acceptor
# yet); False, it is ready (only a ready life sends these). `RecoverReply` and `ColdAnswer`
# say which themselves.
_FROM_RECOVERING: dict[type, bool] = {
    Recover: True,
    ColdStart: True,
    ColdStarted: False,
    Prepare: False,
    Promise: False,
    Refuse: False,
    Renew: False,
    Renewed: False,
    Resign: False,
    Accept: False,
    Accepted: False,
}

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

# -- state ----------------------------------------------------------------------------------


class _Acceptor:
    __slots__ = ("promised", "copy", "lessee", "lease_ballot", "lease_until", "wanted")

    def __init__(self) -> None:
        self.promised = NO_BALLOT
        self.copy = SlotCopy()
        self.lessee: str | None = None
        self.lease_ballot = NO_BALLOT
        self.lease_until = -math.inf
        # Members refused for the lease since the lessee last heard of it.
        self.wanted: set[str] = set()

    def leased_to_other(self, member: str, now: float) -> bool:
        return self.lessee not in (None, member) and now < self.lease_until

    def lease(self, ballot: Ballot, now: float, duration: float) -> None:
        if self.lessee != ballot.member:
            self.wanted.clear()
        self.promised = max(self.promised, ballot)
        self.lessee, self.lease_ballot, self.lease_until = ballot.member, ballot, now + duration


PREPARING, WRITING, ACTING = "preparing", "writing", "acting"


@dataclass
class _Owned:
    """A slot this node takes or holds."""

    ballot: Ballot
    phase: str
    prepared_at: float
    promises: dict[str, Promise] = field(default_factory=dict)
    refused_by_lease: set[str] = field(default_factory=set)
    # The longest another member's lease still ran at an acceptor that refused this ballot.
    lease_left: float = 0.0
    # When to prepare again under a larger ballot if a quorum has not promised by then.
    ask_again_at: float = math.inf
    writer: SlotWriter | None = None
    # Send time of the last lease round a quorum confirmed.
    lease_from: float = -math.inf
    adopted: Ballot = NO_BALLOT
    cold: bool = False
    # Member -> the acceptors that reported it asked for this slot in vain, and when.
    wanted: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class _Round:
    sent: float
    slots: dict[int, Ballot]
    confirmed: dict[int, set[str]] = field(default_factory=dict)


class _Reply:
    """What one member answered a recovering life, so far, to a `Recover` sent at `asked_at`."""

    __slots__ = ("nonce", "asked_at", "ready", "era", "parts", "images")

    def __init__(self, nonce: int, asked_at: float, ready: bool, era: int, parts: int) -> None:
        self.nonce = nonce
        self.asked_at = asked_at
        self.ready = ready
        self.era = era
        self.parts = parts
        self.images: dict[int, list[SlotImage]] = {}

    @property
    def complete(self) -> bool:
        return len(self.images) == self.parts


class _Recovery:
    """A new life's reading of the others' slots, and its cold-start proposal, if any."""

    def __init__(self) -> None:
        # member -> the nonce of the last `Recover` sent it, and when
        self.asked: dict[str, tuple[int, float]] = {}
        self.replies: dict[str, _Reply] = {}
        self.proposal: Ballot | None = None
        self.accepted_by: set[str] = set()
        # No proposal before then (a larger one was accepted elsewhere: let it win).
        self.propose_after = -math.inf


class Ownership:
    def __init__(
        self,
        me: str,
        *,
        lease: float,
        settle: float,
        era_floor: int,
        rng: random.Random,
        now: float,
    ) -> None:
        """`lease`: how long an acceptor's lease promise lasts; `settle`: how long a new life
        learns the voters before it decides anything about recovery; `era_floor`: the least era
        a cold start this life takes part in may pick (above the era its previous lives kept on
        disk, if the node keeps one, and at least the wall clock in milliseconds)."""
        self.me = me
        self.lease = lease
        self.usable_lease = lease * (1 - DRIFT) / (1 + DRIFT)
        self._rng = rng
        self._era_floor = era_floor
        self._now = now
        self._quarantine_until = now + lease * (1 + DRIFT) / (1 - DRIFT)
        self._settle_until = now + settle
        # The membership heard from every member it knows of (`knows_the_voters`).
        self._voters_known = False
        self.era = 0
        self.ready = False
        self._acceptors = [_Acceptor() for _ in range(SLOTS)]
        self._owned: dict[int, _Owned] = {}
        # Per slot, the largest ballot seen anywhere: a new one goes above it.
        self._seen = [NO_BALLOT] * SLOTS
        # When to try to take a slot again (after a refusal or a lost lease), and how long the
        # next wait after a refusal is (it doubles while refusals go on).
        self._retry_at = [-math.inf] * SLOTS
        self._backoff = [self.lease / 8] * SLOTS
        self._live: dict[str, int] = {}
        # Members whose life is recovering, by what they sent last (`_FROM_RECOVERING`).
        self._recovering: set[str] = set()
        self._voters: frozenset[str] = frozenset({me})
        self._quorum = 1
        self._ring_owners: list[str | None] = [None] * SLOTS
        # The slots the ring names this node for, and those of them it does not hold.
        self._mine: list[int] = []
        # Slots waiting for their previous owner's promise before they adopt a state.
        self._awaiting_previous: set[int] = set()
        # Slots to resign once their writes are committed.
        self._to_resign: set[int] = set()
        # `next_deadline()`, until something changes it (None: to be computed).
        self._deadline: float | None = None
        # Slot -> the member an acceptor that refused this node said holds its lease, and until
        # when (for routing only).
        self._lessees: dict[int, tuple[str, float]] = {}
        self._rounds: dict[int, _Round] = {}
        self._next_round = 0
        self._renew_at = -math.inf
        self._recovery: _Recovery | None = _Recovery()
        self._recover_at = now
        # The largest cold-start proposal this life accepted, the one it started, and one that
        # won while this life did not know the voters yet (it starts once it does).
        self._accepted_cold = Ballot(era_floor, 0, "")
        self._started_cold: Ballot | None = None
        self._cold_started: Ballot | None = None
        # (sender, slot) -> the latest ballot a member prepared before this life was ready:
        # answered once it is (at most one per member and slot).
        self._early_prepares: dict[tuple[str, int], Ballot] = {}
        self._outbox: list[tuple[str, Message]] = []
        self._local: list[Message] = []
        self._events: list[Event] = []
        self.gate: CommitGate = CommitGate()
        self.leaving = False
        # Counters, for metrics.
        self.gained = 0
        self.lost = 0
        self.resigned = 0

    # -- queries ----------------------------------------------------------------------------

    def acting(self, slot: int, now: float) -> bool:
        """Does this node act for `slot` now (it gained it, and its lease runs)?"""
        return self.acting_ballot(slot, now) is not None

    def acting_ballot(self, slot: int, now: float) -> Ballot | None:
        """The ballot this node acts for `slot` under now, if it does. It acts from the moment
        a quorum accepted its write, before `events` has said so: what adopts a slot's state
        from the `Gained` event compares its ballot with this one."""
        owned = self._owned.get(slot)
        if owned is not None and owned.phase == ACTING:
            if now < owned.lease_from + self.usable_lease:
                return owned.ballot
        return None

    def reaches_quorum(self, now: float) -> bool:
        """Did a quorum confirm a lease round this node sent in the last half lease? Then its
        own links to most acceptors carry messages both ways now (hearing of most members
        through gossip does not show that: one member can relay what the others say)."""
        return any(
            owned.phase == ACTING and now - owned.lease_from <= self.lease / 2
            for owned in self._owned.values()
        )

    def serves_share(self, now: float) -> bool:
        """Does this node act for every slot its ring names it for?"""
        return self.ready and all(
            self.acting(slot, now)
            for slot, owner in enumerate(self._ring_owners)
            if owner == self.me
        )

    def owner_of(self, slot: int) -> str | None:
        """The member this node's ring names for `slot` (who should take it)."""
        return self._ring_owners[slot]

    def actor_of(self, slot: int, now: float) -> str | None:
        """Where to send what `slot` needs: this node if it acts for it; else, while the lease
        this node's acceptor promised runs, its lessee, or the writer of a larger ballot the
        acceptor accepted since (it won a quorum after that promise); else the lessee a refusal
        named, while its lease runs; else the member the ring names (it is taking the slot, or
        will). Never this node for a lease it heard of but does not act under: that is its own
        prepare, which did not win (or whose lease it let go), and serving here would answer
        503 while another member acts (docs/cluster.md, "Routing")."""
        if self.acting(slot, now):
            return self.me
        acceptor = self._acceptors[slot]
        if now < acceptor.lease_until:
            written = acceptor.copy.accepted
            lessee = written.member if written > acceptor.lease_ballot else acceptor.lessee
            if lessee != self.me and lessee in self._live:
                return lessee
        lessee, until = self._lessees.get(slot, (None, -math.inf))
        if lessee != self.me and lessee in self._live and now < until:
            return lessee
        return self._ring_owners[slot]

    def acting_slots(self, now: float) -> list[int]:
        return [slot for slot in self._owned if self.acting(slot, now)]

    def acts_for_any(self, now: float) -> bool:
        return any(self.acting(slot, now) for slot in self._owned)

    @property
    def kept_era(self) -> int:
        """The largest era this life entered or accepted a cold start of, or its floor: what
        a node with a state directory keeps on disk before anything leaves it, so that its
        next life's cold start goes above it (docs/cluster.md, "Eras across cold starts")."""
        return max(self.era, self._accepted_cold.era)

    @property
    def voters(self) -> frozenset[str]:
        return self._voters

    def events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def outbox(self) -> list[tuple[str, Message]]:
        outbox, self._outbox = self._outbox, []
        return outbox

    def next_deadline(self) -> float:
        """When `tick` has something to do next."""
        if self._deadline is None:
            self._deadline = self._compute_deadline()
        return self._deadline

    def _compute_deadline(self) -> float:
        now = self._now
        deadlines = [self._renew_at if self._owned else math.inf]
        if not self.ready:
            deadlines.extend(d for d in (self._settle_until, self._quarantine_until) if d > now)
            deadlines.append(self._recover_at)
        for owned in self._owned.values():
            if owned.phase == ACTING:
                deadlines.append(owned.lease_from + self.usable_lease)
            else:
                deadlines.append(min(owned.prepared_at + self.lease, owned.ask_again_at))
        deadlines.extend(
            self._owned[slot].prepared_at + self.lease / 2 for slot in self._awaiting_previous
        )
        if self.ready and not self.leaving:
            deadlines.extend(self._retry_at[slot] for slot in self._mine if slot not in self._owned)
        return min(deadlines)

    # -- inputs -----------------------------------------------------------------------------

    def members_changed(self, live: Mapping[str, int], voters: Collection[str], now: float) -> None:
        """The live members (id -> life) and the voters (members not gone for good) changed."""
        self._live = dict(live)
        self._voters = frozenset(voters) | {self.me}
        self._quorum = quorum_of(self._voters)
        self._designate()
        self.tick(now)

    def knows_the_voters(self, now: float) -> None:
        """The membership heard from each seed and every member they named
        (`Membership.knows_the_cluster`): recovery decides without waiting out `settle`, and
        a cold start, once every other voter answers as a new life with nothing, without the
        quarantine either (docs/cluster.md, "New lives, and a cold start")."""
        if self.ready or self._voters_known:
            return
        self._voters_known = True
        self._settle_until = min(self._settle_until, now)
        self.tick(now)

    def _designate(self) -> None:
        """Name a live member for each slot: the ring over those not recovering (this node
        too, while it recovers: what it is asked meanwhile goes to those that can act)."""
        named = self._live.keys() - self._recovering
        if not self.ready and named - {self.me}:
            named -= {self.me}
        self._ring_owners = slot_owners(Ring(named))
        # Only a quorum of live members can take a slot: alone, this node names itself for
        # every slot, and would ask for all of them in vain.
        before = set(self._mine)
        if len(self._live.keys() & self._voters) >= self._quorum:
            self._mine = [s for s, owner in enumerate(self._ring_owners) if owner == self.me]
        else:
            self._mine = []
        for slot in self._mine:
            if slot not in before:  # newly this node's: take it now, whatever it waited for
                self._retry_at[slot] = -math.inf
                self._backoff[slot] = self.lease / 8
        self._deadline = None

    def tick(self, now: float) -> None:
        """Run what is due: lease ends, renewals, takes and retries, resignations, recovery."""
        self._now = now
        self._deadline = None
        if not self.ready:
            self._recover(now)
        for slot, owned in list(self._owned.items()):
            if owned.phase == ACTING and now >= owned.lease_from + self.usable_lease:
                self._lose(slot, now, resigned=False)
            elif owned.phase != ACTING and now >= owned.prepared_at + self.lease:
                self._give_up(slot, now)  # no quorum in a whole lease
            elif owned.phase == PREPARING and now >= owned.ask_again_at:
                self._lose(slot, now, resigned=False)
                self._retry_at[slot] = now
        for slot in list(self._awaiting_previous):
            awaiting = self._owned.get(slot)
            if awaiting is None or awaiting.phase != PREPARING:
                self._awaiting_previous.discard(slot)
            else:
                self._adopt_when_promised(slot, awaiting, now)
        if self.ready:
            if self.leaving:
                self._to_resign.update(self._owned)
            for slot in list(self._to_resign):
                self._resign(slot, now)
            if not self.leaving:
                for slot in self._mine:
                    if slot not in self._owned and now >= self._retry_at[slot]:
                        self._prepare(slot, now)
            if self._owned and now >= self._renew_at:
                self._renew(now)
        self._drain(now)

    def receive(self, sender: str, message: Message, now: float) -> None:
        self._now = now
        self._handle(sender, message, now)
        self._drain(now)

    def write(self, slot: int, records: list[Record], gone: list[int | str], now: float) -> None:
        """Write the changes of a slot this node acts for (`acting(slot, now)`)."""
        owned = self._owned[slot]
        assert owned.writer is not None  # it acts for the slot
        write = Accept(slot, owned.ballot, owned.writer.next_version(now), False, records, gone)
        self.gate.written(slot, write.version)
        self._to_voters(write)
        self._drain(now)

    def leave(self, now: float) -> None:
        """This node stops: it resigns every slot (once its writes are committed), takes
        none, and so hands every lease back before it says goodbye."""
        self.leaving = True
        self.tick(now)

    def due(self, now: float) -> bool:
        """Has `tick` something to do now?"""
        return now >= self.next_deadline()

    # -- acceptor ---------------------------------------------------------------------------

    def _handle(self, sender: str, message: Message, now: float) -> None:
        recovering = _FROM_RECOVERING.get(type(message))
        if isinstance(message, RecoverReply):
            recovering = not message.ready
        elif isinstance(message, ColdAnswer):
            # One that accepted the cold start this node won starts with it: named in the ring
            # at once, it does not take the slots of the others and hand them back.
            started = self._started_cold
            joins = started is not None and message.accepted == message.proposal == started
            recovering = not message.ready and not joins
        if recovering is not None and (sender in self._recovering) != recovering:
            if recovering:
                self._recovering.add(sender)
            else:
                self._recovering.discard(sender)
            self._designate()
        match message:
            case Prepare(slot, ballot):
                self._on_prepare(sender, slot, ballot, now)
            case Promise() | Refuse():
                self._on_answer(sender, message, now)
            case Renew(number, era, slots, numbers):
                ballots = [Ballot(era, n, sender) for n in numbers]
                self._on_renew(sender, number, slots, ballots, now)
            case Renewed():
                self._on_renewed(sender, message, now)
            case Resign(slot, ballot):
                acceptor = self._acceptors[slot]
                if acceptor.lessee == ballot.member and acceptor.lease_ballot == ballot:
                    acceptor.lease_until = -math.inf
                if self._ring_owners[slot] == self.me and slot not in self._owned:
                    self._retry_at[slot] = now  # handed to this node: take it now
                    self._deadline = None
            case Accept():
                self._on_accept(sender, message, now)
            case Accepted(slot, ballot, version):
                self._on_accepted(sender, slot, ballot, version, now)
            case Recover(nonce):
                self._on_recover(sender, nonce, now)
            case RecoverReply():
                self._on_recover_reply(sender, message, now)
            case ColdStart(proposal):
                self._on_cold_start(sender, proposal)
            case ColdAnswer():
                self._on_cold_answer(sender, message, now)
            case ColdStarted(proposal):
                if not self.ready and self._accepted_cold == proposal:
                    self._cold_started = proposal
                    self._recover(now)

    def _see(self, slot: int, ballot: Ballot, now: float) -> None:
        if ballot > self._seen[slot]:
            self._seen[slot] = ballot
        if ballot.era > self.era and self.ready:
            self._new_era(ballot.era, now)

    def _on_prepare(self, sender: str, slot: int, ballot: Ballot, now: float) -> None:
        if not self.ready:
            self._early_prepares[sender, slot] = ballot
            return
        self._see(slot, ballot, now)
        acceptor = self._acceptors[slot]
        if ballot <= acceptor.promised or ballot.era < self.era:
            self._send(sender, Refuse(slot, ballot, max(acceptor.promised, self._floor()), 0.0))
        elif acceptor.leased_to_other(ballot.member, now):
            acceptor.wanted.add(ballot.member)
            left = acceptor.lease_until - now
            refusal = Refuse(slot, ballot, acceptor.promised, left, acceptor.lessee or "")
            self._send(sender, refusal)
        else:
            acceptor.lease(ballot, now, self.lease)
            copy = acceptor.copy
            self._send(
                sender, Promise(slot, ballot, copy.accepted, copy.version, copy.records(now))
            )

    def _on_renew(
        self, sender: str, number: int, slots: list[int], ballots: list[Ballot], now: float
    ) -> None:
        if not self.ready:
            return
        renewed, refused, promised, wanted, wanted_by = [], [], [], [], []
        for slot, ballot in zip(slots, ballots, strict=True):
            self._see(slot, ballot, now)
            acceptor = self._acceptors[slot]
            if ballot < acceptor.promised or acceptor.leased_to_other(ballot.member, now):
                refused.append(slot)
                promised.append(acceptor.promised)
                continue
            acceptor.lease(ballot, now, self.lease)
            renewed.append(slot)
            for member in sorted(acceptor.wanted):
                wanted.append(slot)
                wanted_by.append(member)
            acceptor.wanted.clear()
        self._send(sender, Renewed(number, renewed, refused, promised, wanted, wanted_by))

    def _on_accept(self, sender: str, write: Accept, now: float) -> None:
        if not self.ready:
            return
        self._see(write.slot, write.ballot, now)
        acceptor = self._acceptors[write.slot]
        if write.ballot < acceptor.promised:
            self._send(sender, Refuse(write.slot, write.ballot, acceptor.promised, 0.0))
            return
        acceptor.promised = write.ballot
        copy = acceptor.copy
        applied = copy.apply(write, now)
        held = copy.version if applied and copy.accepted == write.ballot else 0
        self._send(sender, Accepted(write.slot, write.ballot, held))

    def _on_recover(self, sender: str, nonce: int, now: float) -> None:
        if not self.ready:
            # Its floor: a cold start it takes part in goes above it.
            self._send(sender, RecoverReply(nonce, False, self._accepted_cold.era, [], 0, 1))
            return
        parts: list[list[SlotImage]] = [[]]
        size = 0
        for slot, acceptor in enumerate(self._acceptors):
            copy = acceptor.copy
            if size + len(copy) > PART_RECORDS and parts[-1]:
                parts.append([])
                size = 0
            parts[-1].append(
                SlotImage(slot, acceptor.promised, copy.accepted, copy.version, copy.records(now))
            )
            size += len(copy) + 1
        for number, images in enumerate(parts):
            self._send(sender, RecoverReply(nonce, True, self.era, images, number, len(parts)))

    def _on_cold_start(self, sender: str, proposal: Ballot) -> None:
        if self.ready:
            self._send(sender, ColdAnswer(proposal, NO_BALLOT, True))
            return
        self._accepted_cold = max(self._accepted_cold, proposal)
        self._send(sender, ColdAnswer(proposal, self._accepted_cold, False))

    # -- recovery ---------------------------------------------------------------------------

    def _recover(self, now: float) -> None:
        if self._cold_started is not None and self._cold_started == self._accepted_cold:
            # A cold start it accepted won: nothing to read. Ready only once it knows the
            # voters, though: with members it had not heard of yet, it would count a quorum of
            # them alone.
            if now >= self._settle_until:
                self._become_ready(self._cold_started.era, now, cold=True)
            return
        recovery = self._recovery
        assert recovery is not None  # it recovers until it is ready
        others = sorted(self._voters - {self.me})
        again = now >= self._recover_at
        if again:
            self._recover_at = now + RECOVER_RETRY
            self._deadline = None
        read = [m for m in others if (r := recovery.replies.get(m)) and self._reads(r)]
        for member in others:
            reply = recovery.replies.get(member)
            # A member just learned of is asked at once, the rest every `RECOVER_RETRY`, and
            # those that sent their copies too early again once the quarantine is over.
            last_asked = recovery.asked.get(member, (0, now))[1]
            early = reply is not None and reply.ready and last_asked < self._quarantine_until <= now
            if (again or member not in recovery.asked or early) and member not in read:
                nonce = self._rng.getrandbits(63)
                recovery.asked[member] = (nonce, now)
                self._send(member, Recover(nonce))
        if now < self._settle_until:
            return
        need = self._quorum
        blank = [m for m in others if (r := recovery.replies.get(m)) and not r.ready]
        # The quarantine waits out leases the previous life promised to a member acting on
        # them; with every voter known and a new life with nothing, none acts (docs/cluster.md).
        if now < self._quarantine_until and not (self._voters_known and len(blank) == len(others)):
            return
        # Any quorum that held the previous life holds at least `need - 1` of the others, so
        # this many ready others share a member with it (docs/cluster.md).
        if read and len(read) >= len(self._voters) - need + 1:
            self._adopt_recovery(read, now)
            return
        if recovery.proposal is not None:
            if len(recovery.accepted_by & self._voters) >= need:
                proposal = recovery.proposal
                self._started_cold = proposal
                self._become_ready(proposal.era, now, cold=True)
                for member in sorted(recovery.accepted_by - {self.me}):
                    self._send(member, ColdStarted(proposal))
            return
        if len(blank) + 1 < need:
            return
        if recovery.propose_after == -math.inf:
            # The smallest id proposes first, the others only if it has not won meanwhile:
            # proposals of all at once split the acceptors, and none may win.
            rank = sorted([*blank, self.me]).index(self.me)
            recovery.propose_after = now + rank * RECOVER_RETRY
        if now >= recovery.propose_after:
            eras = [reply.era for reply in recovery.replies.values()]
            era = max(self._era_floor, self._accepted_cold.era, *eras) + 1
            recovery.proposal = Ballot(era, 0, self.me)
            self._accepted_cold = recovery.proposal
            recovery.accepted_by = {self.me}
            for member in others:
                self._send(member, ColdStart(recovery.proposal))

    def _reads(self, reply: _Reply) -> bool:
        """Does `reply` count in the recovery read? Only a whole copy from a ready member,
        asked for once the quarantine was over: a quorum that held this member's previous
        life may still be forming before then, its other members not yet holding what they
        will have accepted (docs/cluster.md, "Which life a vote belongs to")."""
        return reply.ready and reply.complete and reply.asked_at >= self._quarantine_until

    def _on_recover_reply(self, sender: str, reply: RecoverReply, now: float) -> None:
        recovery = self._recovery
        if recovery is None:
            return
        nonce, asked_at = recovery.asked.get(sender, (None, 0.0))
        if nonce != reply.nonce:
            return
        known = recovery.replies.get(sender)
        if known is None or known.nonce != reply.nonce:
            known = _Reply(reply.nonce, asked_at, reply.ready, reply.era, reply.parts)
            recovery.replies[sender] = known
        known.images[reply.part] = reply.images
        self._recover(now)

    def _adopt_recovery(self, ready: list[str], now: float) -> None:
        assert self._recovery is not None
        replies = [self._recovery.replies[member] for member in ready]
        era = max(reply.era for reply in replies)
        best: list[SlotImage | None] = [None] * SLOTS
        promised = [NO_BALLOT] * SLOTS
        for reply in replies:
            for image in (image for part in reply.images.values() for image in part):
                promised[image.slot] = max(promised[image.slot], image.promised)
                current = best[image.slot]
                if image.accepted.era == era and (
                    current is None
                    or (image.accepted, image.version) > (current.accepted, current.version)
                ):
                    best[image.slot] = image
        self.era = era
        for slot, acceptor in enumerate(self._acceptors):
            acceptor.promised = max(promised[slot], self._floor())
            adopted = best[slot]
            if adopted is None:
                acceptor.copy.clear()
            else:
                acceptor.copy.replace(adopted.accepted, adopted.version, adopted.records, now)
            self._seen[slot] = max(self._seen[slot], acceptor.promised)
        self._recovery = None
        self.ready = True
        self._designate()
        self._events.append(Ready(era, cold=False))
        self._answer_early_prepares(now)

    def _on_cold_answer(self, sender: str, answer: ColdAnswer, now: float) -> None:
        recovery = self._recovery
        accepted = not answer.ready and answer.accepted == answer.proposal
        if recovery is None and accepted and answer.proposal == self._started_cold:
            # Accepted after the quorum did: it starts in the era too, as those did.
            self._send(sender, ColdStarted(answer.proposal))
            return
        if recovery is None or recovery.proposal != answer.proposal:
            return
        if answer.ready or answer.accepted != answer.proposal:
            # Someone has state (recover from the ready ones), or a larger proposal is accepted
            # there (let it win), or its floor is above this proposal (go above it next time).
            self._era_floor = max(self._era_floor, answer.accepted.era)
            recovery.proposal = None
            recovery.propose_after = now + self._rng.uniform(RECOVER_RETRY, 2 * RECOVER_RETRY)
            return
        recovery.accepted_by.add(sender)
        self._recover(now)

    def _become_ready(self, era: int, now: float, cold: bool) -> None:
        # The members of a cold start become ready with this node; one that does not will
        # send `Recover` again.
        self._recovering.clear()
        self.era = era
        for slot, acceptor in enumerate(self._acceptors):
            acceptor.promised = self._floor()
            acceptor.copy.clear()
            self._seen[slot] = max(self._seen[slot], acceptor.promised)
        self._recovery = None
        self.ready = True
        self._designate()
        self._deadline = None
        self._events.append(Ready(era, cold=cold))
        self._answer_early_prepares(now)

    def _answer_early_prepares(self, now: float) -> None:
        """Answer the prepares that came before this life was ready, as if they came now (as
        late as the network may bring any): unanswered, their preparers would wait a lease for
        the promises they need, members of the same cold start more than a second apart."""
        early, self._early_prepares = self._early_prepares, {}
        for (sender, slot), ballot in sorted(early.items()):
            self._on_prepare(sender, slot, ballot, now)

    def _new_era(self, era: int, now: float) -> None:
        """A larger era started elsewhere: whatever this node holds of an older one could not
        have been committed since (docs/cluster.md), and is dropped."""
        self.era = era
        for slot in list(self._owned):
            self._lose(slot, now, resigned=False)
        for acceptor in self._acceptors:
            acceptor.promised = max(acceptor.promised, self._floor())
            if acceptor.copy.accepted.era < era:
                acceptor.copy.clear()

    def _floor(self) -> Ballot:
        return Ballot(self.era, 0, "")

    # -- owner ------------------------------------------------------------------------------

    def _prepare(self, slot: int, now: float) -> None:
        seen = self._seen[slot]
        ballot = Ballot(self.era, seen.number + 1 if seen.era == self.era else 1, self.me)
        self._seen[slot] = ballot
        self._owned[slot] = _Owned(ballot, PREPARING, now)
        self._deadline = None
        self._to_voters(Prepare(slot, ballot))

    def _on_answer(self, sender: str, answer: Promise | Refuse, now: float) -> None:
        slot = answer.slot
        if isinstance(answer, Refuse):
            self._see(slot, answer.promised, now)
            if answer.lessee:
                self._lessees[slot] = (answer.lessee, now + answer.lease_left)
        owned = self._owned.get(slot)
        if owned is None or answer.ballot != owned.ballot:
            return
        if isinstance(answer, Refuse):
            if answer.lease_left > 0 and owned.phase == PREPARING:
                owned.refused_by_lease.add(sender)
                owned.lease_left = max(owned.lease_left, answer.lease_left)
                self._ask_again_after_leases(slot, owned, now)
            elif answer.promised > owned.ballot and owned.phase == PREPARING:
                self._give_up(slot, now)
            # A refused write of a slot this node holds: it stays committed by the others of
            # the quorum, and the lease ends the slot if a quorum has moved on.
            return
        if owned.phase == PREPARING:
            owned.promises[sender] = answer
            self._adopt_when_promised(slot, owned, now)
            if owned.phase == PREPARING and self._owned.get(slot) is owned:
                self._ask_again_after_leases(slot, owned, now)

    def _ask_again_after_leases(self, slot: int, owned: _Owned, now: float) -> None:
        """A quorum answered but too few promised, some because another member's lease runs
        there: that member resigns once a quorum tells it this node asked (and its ring
        agrees), else the lease ends within `lease_left`: ask again then, not a whole lease
        later. Checked whichever answer comes last: with acceptors' clocks at different rates,
        one lease ends before another, and a promise can follow a refusal (seed 567534553
        with skew: a slot waited two seconds, and a heartbeated lease ran out). Until then the
        ballot stays open: the voters that have not answered yet may still make a quorum."""
        answered = (owned.refused_by_lease | owned.promises.keys()) & self._voters
        if not owned.refused_by_lease or len(answered) < self._quorum:
            return
        if len(owned.promises.keys() & self._voters) >= self._quorum:
            return
        if owned.ask_again_at == math.inf:
            wait = min(owned.lease_left, self.lease / 4)
            owned.ask_again_at = now + wait * self._rng.uniform(1.0, 1.1)
            self._deadline = None

    def _adopt_when_promised(self, slot: int, owned: _Owned, now: float) -> None:
        promises = owned.promises
        if len(promises.keys() & self._voters) < self._quorum:
            return
        best = latest(p for p in promises.values() if p.accepted.era == self.era)
        previous = best.accepted.member if best is not None else None
        if (
            previous not in (None, self.me)
            and previous not in promises
            and previous in self._live
            and previous not in self._recovering
            and now < owned.prepared_at + self.lease / 2
        ):
            # What it hands over comes ahead of its promise: wait a little for it.
            self._awaiting_previous.add(slot)
            return
        self._awaiting_previous.discard(slot)
        self._deadline = None
        records = best.records if best is not None else []
        owned.adopted = best.accepted if best is not None else NO_BALLOT
        owned.cold = best is None
        owned.phase = WRITING
        owned.lease_from = owned.prepared_at
        owned.writer = SlotWriter(slot, owned.ballot, now, self.usable_lease)
        write = Accept(slot, owned.ballot, owned.writer.next_version(now), True, records, [])
        self.gate.written(slot, write.version)
        self._to_voters(write)

    def _give_up(self, slot: int, now: float) -> None:
        """Stop taking `slot` under this ballot; try again later, later each time."""
        self._lose(slot, now, resigned=False)
        wait = self._backoff[slot]
        self._backoff[slot] = min(2 * wait, self.lease / 2)
        self._retry_at[slot] = now + wait * self._rng.uniform(0.5, 1.0)

    def _on_accepted(
        self, sender: str, slot: int, ballot: Ballot, version: int, now: float
    ) -> None:
        owned = self._owned.get(slot)
        if owned is None or owned.writer is None or owned.ballot != ballot:
            return
        writer = owned.writer
        if writer.held(sender, version, now):
            copy = self._acceptors[slot].copy
            if copy.accepted == ballot:
                self._send(sender, Accept(slot, ballot, copy.version, True, copy.records(now), []))
        committed = writer.committed(self._voters, now)
        self.gate.committed(slot, committed)
        if slot in self._to_resign:
            self._resign(slot, now)
        if owned.phase == WRITING and committed >= 1:
            if now >= owned.lease_from + self.usable_lease:
                # Committed only after the lease it was taken under ran out (this node was
                # paused, say): another may have taken the slot and written since, and what
                # this node adopted lacks it. Not gained, even for a moment.
                self._give_up(slot, now)
                return
            owned.phase = ACTING
            self._backoff[slot] = self.lease / 8
            self._deadline = None
            self.gained += 1
            records = self._acceptors[slot].copy.records(now)
            self._events.append(Gained(slot, ballot, owned.adopted, records, owned.cold))

    def _renew(self, now: float) -> None:
        self._renew_at = now + self.lease / 4
        self._deadline = None
        slots = {s: o.ballot for s, o in self._owned.items() if o.phase != PREPARING}
        if not slots:
            return
        self._next_round += 1
        self._rounds[self._next_round] = _Round(now, slots)
        for number in [n for n, r in self._rounds.items() if r.sent < now - self.lease]:
            del self._rounds[number]
        numbers = [ballot.number for ballot in slots.values()]
        self._to_voters(Renew(self._next_round, self.era, list(slots), numbers))
        self._resend_uncommitted(now)

    def _resend_uncommitted(self, now: float) -> None:
        """A write no quorum acknowledged yet goes again, whole, to the live voters that have
        said nothing newer for half a lease: its Accept or their Accepted may have been lost
        with a broken link, and without a later write nothing else would tell (what waits on
        it would wait for good). Not sooner: under a stream of writes most slots have one on
        its way at any time, and sending them all whole every round clogged the links until
        the members counted each other down (100,000 peers made at one node of three)."""
        for slot, owned in self._owned.items():
            writer = owned.writer
            if writer is None or not writer.pending(self._voters, now):
                continue
            copy = self._acceptors[slot].copy
            if copy.accepted != owned.ballot:
                continue
            if now - writer.sent_at(writer.version) >= self.usable_lease / 2:
                # Its acceptors' words are half spent (`SlotWriter.committed`): before they
                # run out, an empty write follows, whose words count afresh. One that does
                # not hold what it follows says so, and gets the slot whole.
                version = writer.next_version(now)
                self._to_voters(Accept(slot, owned.ballot, version, False, [], []))
                continue
            stalled = writer.stalled(self._voters & self._live.keys(), now, self.lease / 2)
            if not stalled:
                continue
            write = Accept(slot, owned.ballot, copy.version, True, copy.records(now), [])
            for member in stalled:
                writer.sent_whole(member, now)
                self._send(member, write)

    def _on_renewed(self, sender: str, answer: Renewed, now: float) -> None:
        for slot, promised in zip(answer.refused, answer.promised, strict=True):
            # One acceptor moved on: the lease runs as long as a quorum renews it.
            self._see(slot, promised, now)
        for slot, member in zip(answer.wanted, answer.wanted_by, strict=True):
            owned = self._owned.get(slot)
            if owned is not None:
                owned.wanted.setdefault(member, {})[sender] = now
                self._consider_resigning(slot, now)
        round_ = self._rounds.get(answer.round)
        if round_ is None:
            return
        need = self._quorum
        for slot in answer.renewed:
            owned = self._owned.get(slot)
            if owned is None or round_.slots.get(slot) != owned.ballot:
                continue
            confirmed = round_.confirmed.setdefault(slot, set())
            confirmed.add(sender)
            if len(confirmed & self._voters) >= need and round_.sent > owned.lease_from:
                owned.lease_from = round_.sent
                self._deadline = None

    def _consider_resigning(self, slot: int, now: float) -> None:
        """A quorum of acceptors reported who asked for `slot`: resign it if that is the
        member this node's ring names for it."""
        owned = self._owned.get(slot)
        designated = self._ring_owners[slot]
        if owned is None or designated in (None, self.me):
            return
        asked = owned.wanted.get(designated, {})
        recent = {member for member, at in asked.items() if at > now - self.lease}
        if len(recent & self._voters) >= self._quorum:
            self._to_resign.add(slot)
            self._resign(slot, now)

    def _resign(self, slot: int, now: float) -> None:
        """Resign `slot` once its writes are committed, so that what was said of it stands."""
        owned = self._owned.get(slot)
        if owned is None or (not self.leaving and self._ring_owners[slot] == self.me):
            self._to_resign.discard(slot)
            return
        if owned.writer is not None and owned.writer.pending(self._voters, now):
            return
        self._to_resign.discard(slot)
        self._lose(slot, now, resigned=True)
        self._to_voters(Resign(slot, owned.ballot))

    def _lose(self, slot: int, now: float, resigned: bool) -> None:
        """Act for `slot` no more (or stop taking it)."""
        owned = self._owned.pop(slot)
        self._deadline = None
        self._to_resign.discard(slot)
        self._awaiting_previous.discard(slot)
        self.gate.lost(slot)
        if not resigned:
            self._retry_at[slot] = now + self._backoff[slot] * self._rng.uniform(0.5, 1.0)
        if owned.phase == ACTING:
            self.lost += 1
            self.resigned += resigned
            self._events.append(Lost(slot, owned.ballot, resigned))

    # -- plumbing ---------------------------------------------------------------------------

    def _to_voters(self, message: Message) -> None:
        for member in sorted(self._voters):
            self._send(member, message)

    def _send(self, member: str, message: Message) -> None:
        if member == self.me:
            self._local.append(message)
        else:
            self._outbox.append((member, message))

    def _drain(self, now: float) -> None:
        local = self._local
        while local:
            self._handle(self.me, local.pop(0), now)


def latest(promises: Iterable[Promise]) -> Promise | None:
    """The promise with the latest copy: the largest (ballot, version) accepted."""
    return max(promises, key=lambda p: (p.accepted, p.version), default=None)
