"""Ownership of slots: which life acts for each slot, and how that changes hands
(docs/cluster.md, invariants O1 and O2). Semaphores and rate limits both go through it.

`Ownership` is the one face of four parts, each keeping one step of docs/cluster.md:

* `cluster/acceptor.py`: every node is an *acceptor* for every slot: its promises, lease
  promises and copies, and its answers to `Prepare`, `Renew`, `Accept`, `Resign` and `Recover`.
* `cluster/slot_leases.py`: a member the ring names for a slot *takes* it (prepare, adopt,
  write), *holds* it while a quorum renews its lease, and *loses* or *resigns* it.
* `cluster/recovery.py`: *a new life* answers as an acceptor only once it waited out its previous
  life's leases and read the slots from enough ready voters, or started a new era with a quorum
  that had nothing (a cold start).
* `cluster/placement.py`: the ring over the members not recovering names who takes each slot;
  routing says where to send what a slot needs.

Here they meet: messages are handed to the part that answers them (`_HANDLERS`), every ballot
heard goes through `_see` (a larger era drops what an older one held), and a life that becomes
ready sets up its acceptor and its ring at once.

Pure: `now` comes in; messages go out through `outbox()`, slot changes through `events()`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .acceptor import Acceptor
from .departures import Claim, Departed
from .ownership_messages import (
    Accept,
    Accepted,
    ColdAnswer,
    ColdStart,
    ColdStarted,
    Event,
    Gained,
    Lost,
    Mailbox,
    Message,
    Prepare,
    Promise,
    Ready,
    Recover,
    RecoverReply,
    Refuse,
    Renew,
    Renewed,
    Resign,
    SlotImage,
)
from .placement import FROM_RECOVERING, Placement
from .recovery import RECOVER_RETRY, ColdWon, Recovered, Recovery, StartCold
from .replication import CommitGate, Record
from .slot_leases import ACTING, PREPARING, WRITING, SlotLeases, latest
from .slots import Ballot

__all__ = [
    "ACTING",
    "PREPARING",
    "RECOVER_RETRY",
    "WRITING",
    "Accept",
    "Accepted",
    "ColdAnswer",
    "ColdStart",
    "ColdStarted",
    "Event",
    "Gained",
    "Lost",
    "Message",
    "Ownership",
    "Prepare",
    "Promise",
    "Ready",
    "Recover",
    "RecoverReply",
    "Refuse",
    "Renew",
    "Renewed",
    "Resign",
    "SlotImage",
    "latest",
]


class Ownership:
    def __init__(
        self,
        me: str,
        *,
        life: int,
        lease: float,
        settle: float,
        era_floor: int,
        rng: random.Random,
        now: float,
        adopted: Callable[[list[Record]], list[Record]] = list,
    ) -> None:
        """`life`: this life's generation (what the membership knows it by), which the leases
        it is promised are for; `lease`: how long an acceptor's lease promise lasts; `settle`:
        how long a new life learns the voters before it decides anything about recovery;
        `era_floor`: the least era a cold start this life takes part in may pick (above the era
        its previous lives kept on disk, if the node keeps one, and at least the wall clock in
        milliseconds); `adopted`: what a new owner writes of the records of the copy it adopted
        (the homes raise their peers' tickets: `cluster.peers.raise_tickets`)."""
        self.me = me
        self.lease = lease
        # The era this life is in, and whether it answers as an acceptor yet.
        self.era = 0
        self.ready = False
        # The `now` of the last input: `next_deadline` leaves out recovery deadlines passed.
        self._now = now
        # `next_deadline()`, until something changes it (None: to be computed).
        self._deadline: float | None = None
        self._events: list[Event] = []
        self._mail = Mailbox(me)
        self.placement = Placement(me)
        self.acceptor = Acceptor(me, lease)
        self.leases = SlotLeases(
            me,
            life=life,
            lease=lease,
            rng=rng,
            placement=self.placement,
            acceptor=self.acceptor,
            mail=self._mail,
            events=self._events,
            deadline_moved=self._deadline_moved,
            # Looked up at each take, so that a planted bug (simulations/planted.py) replaces it.
            choose_copy=lambda promises: latest(promises),
            adopted=adopted,
        )
        self.recovery = Recovery(
            me,
            life=life,
            lease=lease,
            settle=settle,
            era_floor=era_floor,
            rng=rng,
            mail=self._mail,
            deadline_moved=self._deadline_moved,
            now=now,
        )

    # -- what the parts keep ----------------------------------------------------------------

    @property
    def usable_lease(self) -> float:
        """How long after a quorum confirmed its lease an owner acts on a slot."""
        return self.leases.usable_lease

    @usable_lease.setter
    def usable_lease(self, seconds: float) -> None:
        self.leases.usable_lease = seconds

    @property
    def gate(self) -> CommitGate:
        return self.leases.gate

    @property
    def leaving(self) -> bool:
        return self.leases.leaving

    @property
    def gained(self) -> int:
        return self.leases.gained

    @property
    def lost(self) -> int:
        return self.leases.lost

    @property
    def resigned(self) -> int:
        return self.leases.resigned

    @property
    def slow(self) -> bool:
        """Do this node's lease rounds reach a quorum too slowly for it to act for slots?"""
        return self.leases.pace.slow

    # -- queries ----------------------------------------------------------------------------

    def acting(self, slot: int, now: float) -> bool:
        """Does this node act for `slot` now (it gained it, and its lease runs)?"""
        return self.acting_ballot(slot, now) is not None

    def acting_ballot(self, slot: int, now: float) -> Ballot | None:
        """The ballot this node acts for `slot` under now, if it does. It acts from the moment
        a quorum accepted its write, before `events` has said so: what adopts a slot's state
        from the `Gained` event compares its ballot with this one."""
        return self.leases.acting_ballot(slot, now)

    def reaches_quorum(self, now: float) -> bool:
        """Did a quorum confirm a lease round this node sent in the last half lease? Then its
        own links to most acceptors carry messages both ways now (hearing of most members
        through gossip does not show that: one member can relay what the others say)."""
        return self.leases.reaches_quorum(now)

    def serves_share(self, now: float) -> bool:
        """Does this node act for every slot its ring names it for?"""
        return self.ready and all(
            self.acting(slot, now)
            for slot, owner in enumerate(self.placement.ring_owners)
            if owner == self.me
        )

    def owner_of(self, slot: int) -> str | None:
        """The member this node's ring names for `slot` (who should take it)."""
        return self.placement.ring_owners[slot]

    def actor_of(self, slot: int, now: float) -> str | None:
        """Where to send what `slot` needs (`Placement.actor_of`)."""
        acting = self.acting(slot, now)
        return self.placement.actor_of(slot, acting, self.acceptor.lease_holder(slot, now), now)

    def acting_slots(self, now: float) -> list[int]:
        return [slot for slot in self.leases.owned if self.acting(slot, now)]

    def acts_for_any(self, now: float) -> bool:
        return any(self.acting(slot, now) for slot in self.leases.owned)

    @property
    def kept_era(self) -> int:
        """The largest era this life entered or accepted a cold start of, or its floor: what
        a node with a state directory keeps on disk before anything leaves it, so that its
        next life's cold start goes above it (docs/cluster.md, "Eras across cold starts")."""
        return max(self.era, self.recovery.accepted_cold.era)

    @property
    def voters(self) -> frozenset[str]:
        return self.placement.voters

    def events(self) -> list[Event]:
        if not self._events:
            return []
        events = list(self._events)
        self._events.clear()
        return events

    def outbox(self) -> list[tuple[str, Message]]:
        outbox, self._mail.outbox = self._mail.outbox, []
        return outbox

    def next_deadline(self) -> float:
        """When `tick` has something to do next."""
        if self._deadline is None:
            deadlines = self.leases.deadlines(self.ready and not self.leaving, self._now)
            if not self.ready:
                deadlines.extend(self.recovery.deadlines(self._now))
            self._deadline = min(deadlines)
        return self._deadline

    def _deadline_moved(self) -> None:
        self._deadline = None

    # -- inputs -----------------------------------------------------------------------------

    def members_changed(self, live: Mapping[str, int], voters: Collection[str], now: float) -> None:
        """The live members (id -> life) and the voters (members not gone for good) changed."""
        self.placement.members_changed(live, voters, self.ready)
        self._designate(now)
        self.tick(now)

    def departures_changed(
        self, departed: Collection[Departed], unsettled: frozenset[Departed], now: float
    ) -> None:
        """The lives of the members that left or were forgotten, and those of them not yet
        settled (cluster/departures.py): this node writes again each slot it acts for, and a
        new life's read counts the unsettled ones."""
        self.leases.settling.departures(departed, set(departed) - unsettled, now)
        self.recovery.departed = unsettled
        self.tick(now)

    def claims(self) -> tuple[Claim, ...]:
        """What this node's writes settled of each departure, for the membership to gossip."""
        return self.leases.settling.claims()

    @property
    def claims_revision(self) -> int:
        """Changes whenever `claims` does."""
        return self.leases.settling.revision

    def unknown_seeds(self, count: int) -> None:
        """How many of this node's seeds belong to no member it knows of
        (`Membership.unknown_seeds`): a cold start counts them as voters it has not heard of
        (docs/cluster.md, "A life that knows nobody"). It only holds decisions back: the next
        `tick` goes by it."""
        self.recovery.unknown_seeds = count

    def knows_the_voters(self, now: float) -> None:
        """The membership heard from each seed and every member they named
        (`Membership.knows_the_cluster`): recovery decides without waiting out `settle`, and
        a cold start, once every other voter answers as a new life with nothing, without the
        quarantine either (docs/cluster.md, "New lives, and a cold start")."""
        if self.ready or self.recovery.voters_known:
            return
        self.recovery.knows_the_voters(now)
        self.tick(now)

    def tick(self, now: float) -> None:
        """Run what is due: lease ends, renewals, takes and retries, resignations, recovery."""
        self._now = now
        self._deadline = None
        if not self.ready:
            self._recover(now)
        self.leases.tick(self.era, self.ready, now)
        self._drain(now)

    def receive(self, sender: str, message: Message, now: float) -> None:
        self._now = now
        self._handle(sender, message, now)
        self._drain(now)

    def write(self, slot: int, records: list[Record], gone: list[int | str], now: float) -> None:
        """Write the changes of a slot this node acts for (`acting(slot, now)`)."""
        self.leases.write(slot, records, gone, now)
        self._drain(now)

    def leave(self, now: float) -> None:
        """This node stops: it resigns every slot (once its writes are committed), takes
        none, and so hands every lease back before it says goodbye."""
        self.leases.leaving = True
        self.tick(now)

    def due(self, now: float) -> bool:
        """Has `tick` something to do now?"""
        return now >= self.next_deadline()

    # -- messages ---------------------------------------------------------------------------

    def _handle(self, sender: str, message: Message, now: float) -> None:
        if sender != self.me:
            self.leases.heard(sender, now)
        recovering = FROM_RECOVERING.get(type(message))
        if isinstance(message, RecoverReply):
            recovering = not message.ready
        elif isinstance(message, ColdAnswer):
            # One that accepted the cold start this node won starts with it: named in the ring
            # at once, it does not take the slots of the others and hand them back.
            recovering = not message.ready and not self.recovery.joins(message)
        if recovering is not None and self.placement.heard(sender, recovering):
            self._designate(now)
        _HANDLERS[type(message)](self, sender, message, now)

    def _on_prepare(self, sender: str, prepare: Prepare, now: float) -> None:
        if not self.ready:
            self.recovery.early_prepares[sender, prepare.slot] = prepare
            return
        slot, ballot = prepare.slot, prepare.ballot
        self._see(slot, ballot, now)
        self._mail.send(sender, self.acceptor.prepare(slot, ballot, prepare.life, self.era, now))

    def _on_answer(self, sender: str, answer: Promise | Refuse, now: float) -> None:
        if isinstance(answer, Refuse):
            self._see(answer.slot, answer.promised, now)
            if answer.lessee:
                self.placement.heard_lessee(answer.slot, answer.lessee, now + answer.lease_left)
        self.leases.on_answer(sender, answer, self.era, now)

    def _on_renew(self, sender: str, renew: Renew, now: float) -> None:
        if self.placement.paced(sender, renew.slow):
            self._designate(now)
        if not self.ready:
            return
        ballots = [Ballot(renew.era, n, sender) for n in renew.numbers]
        # The ballots of a renewal are of one era: a larger one starts at the first seen,
        # before the acceptor answers for any slot.
        for slot, ballot in zip(renew.slots, ballots, strict=True):
            self._see(slot, ballot, now)
        answer = self.acceptor.renew(renew.round, renew.slots, ballots, renew.life, now)
        self._mail.send(sender, answer)

    def _on_renewed(self, sender: str, answer: Renewed, now: float) -> None:
        for slot, promised in zip(answer.refused, answer.promised, strict=True):
            # One acceptor moved on: the lease runs as long as a quorum renews it.
            self._see(slot, promised, now)
        if self.leases.on_renewed(sender, answer, now):
            self.placement.paced(self.me, self.leases.pace.slow)
            self._designate(now)

    def _on_resign(self, sender: str, resign: Resign, now: float) -> None:
        wrote = self.acceptor.slots[resign.slot].copy.accepted == resign.ballot
        self.acceptor.resign(resign.slot, resign.ballot)
        # An owner that acted hands its slot on; a prepare given up hands nothing over, and what
        # this node gave up it does not take back at once.
        if wrote and sender != self.me:
            self.leases.handed_over(resign.slot, resign.ballot, now)

    def _on_accept(self, sender: str, write: Accept, now: float) -> None:
        if not self.ready:
            return
        self._see(write.slot, write.ballot, now)
        self._mail.send(sender, self.acceptor.accept(write, now))

    def _on_accepted(self, sender: str, answer: Accepted, now: float) -> None:
        self.leases.on_accepted(sender, answer.slot, answer.ballot, answer.version, now)

    def _on_recover(self, sender: str, recover: Recover, now: float) -> None:
        self.acceptor.recovering(sender, recover.life)
        if not self.ready:
            # Its floor: a cold start it takes part in goes above it.
            floor = self.recovery.accepted_cold.era
            self._mail.send(sender, RecoverReply(recover.nonce, False, floor, [], 0, 1))
            return
        parts = self.acceptor.images(now)
        for number, images in enumerate(parts):
            reply = RecoverReply(recover.nonce, True, self.era, images, number, len(parts))
            self._mail.send(sender, reply)

    def _on_recover_reply(self, sender: str, reply: RecoverReply, now: float) -> None:
        if self.recovery.on_recover_reply(sender, reply):
            self._recover(now)

    def _on_cold_start(self, sender: str, cold_start: ColdStart, now: float) -> None:
        self.recovery.on_cold_start(sender, cold_start.proposal, self.ready)

    def _on_cold_answer(self, sender: str, answer: ColdAnswer, now: float) -> None:
        if self.recovery.on_cold_answer(sender, answer, now):
            self._recover(now)

    def _on_cold_started(self, sender: str, started: ColdStarted, now: float) -> None:
        if self.recovery.on_cold_started(started.proposal, self.ready):
            self._recover(now)

    # -- across the parts -------------------------------------------------------------------

    def _see(self, slot: int, ballot: Ballot, now: float) -> None:
        self.leases.see(slot, ballot)
        if ballot.era > self.era and self.ready:
            self._new_era(ballot.era, now)

    def _new_era(self, era: int, now: float) -> None:
        """A larger era started elsewhere: whatever this node holds of an older one could not
        have been committed since (docs/cluster.md), and is dropped."""
        self.era = era
        self.leases.lose_all(now)
        self.acceptor.enter_era(era)

    def _designate(self, now: float) -> None:
        mine, seconded = self.placement.designate(self.ready)
        self.leases.newly_mine(mine)
        self.leases.newly_seconded(seconded, now)
        self._deadline = None

    def _recover(self, now: float) -> None:
        decision = self.recovery.step(self.placement.voters, self.placement.quorum, now)
        if isinstance(decision, StartCold):
            self._become_ready(decision.era, now, cold=True)
        elif isinstance(decision, ColdWon):
            self._become_ready(decision.proposal.era, now, cold=True)
            self.recovery.announce(decision)
        elif isinstance(decision, Recovered):
            self._adopt_recovery(decision, now)

    def _become_ready(self, era: int, now: float, cold: bool) -> None:
        # The members of a cold start become ready with this node; one that does not will
        # send `Recover` again.
        self.placement.recovering.clear()
        self.era = era
        self.acceptor.start_empty(era)
        self._see_promises()
        self.recovery.ready()
        self.ready = True
        self._designate(now)
        self._events.append(Ready(era, cold=cold))
        self._answer_early_prepares(now)

    def _adopt_recovery(self, recovered: Recovered, now: float) -> None:
        self.era = recovered.era
        self.acceptor.restore(recovered.era, recovered.promised, recovered.best, now)
        self._see_promises()
        self.recovery.ready()
        self.ready = True
        self._designate(now)
        self._events.append(Ready(recovered.era, cold=False))
        self._answer_early_prepares(now)

    def _see_promises(self) -> None:
        """A new owner's ballot goes above what this node's acceptor promised."""
        seen = self.leases.seen
        for slot, acceptor in enumerate(self.acceptor.slots):
            seen[slot] = max(seen[slot], acceptor.promised)

    def _answer_early_prepares(self, now: float) -> None:
        """Answer the prepares that came before this life was ready, as if they came now (as
        late as the network may bring any): unanswered, their preparers would wait a lease for
        the promises they need, members of the same cold start more than a second apart."""
        early, self.recovery.early_prepares = self.recovery.early_prepares, {}
        for (sender, _), prepare in sorted(early.items(), key=lambda item: item[0]):
            self._on_prepare(sender, prepare, now)

    def _drain(self, now: float) -> None:
        local = self._mail.local
        while local:
            self._handle(self.me, local.pop(0), now)


# Which part answers each message (`Ownership._handle`).
_HANDLERS: dict[type, Callable[[Ownership, str, Any, float], None]] = {
    Prepare: Ownership._on_prepare,
    Promise: Ownership._on_answer,
    Refuse: Ownership._on_answer,
    Renew: Ownership._on_renew,
    Renewed: Ownership._on_renewed,
    Resign: Ownership._on_resign,
    Accept: Ownership._on_accept,
    Accepted: Ownership._on_accepted,
    Recover: Ownership._on_recover,
    RecoverReply: Ownership._on_recover_reply,
    ColdStart: Ownership._on_cold_start,
    ColdAnswer: Ownership._on_cold_answer,
    ColdStarted: Ownership._on_cold_started,
}
