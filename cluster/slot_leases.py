"""The owner's side of slot ownership: taking, holding and giving up the slots its ring names it
for (docs/cluster.md, "O1: ballots and leases", "O2: quorum writes").

1. `Prepare(ballot)` to every voter. An acceptor promises (`Promise`, with its copy) if the
   ballot is above its promise and no lease it gave another member runs; that answer is a lease
   to the preparer too. Otherwise `Refuse`, saying why.
2. With promises from a quorum (and from the slot's previous owner, if it is alive: what it hands
   over travels on the same link, ahead of its promise), the new owner adopts the copy with the
   largest (ballot, version) and writes it whole under its own ballot.
3. Once that write is committed, the slot is *gained*: the owner acts on it while its lease runs,
   until `sent + lease × (1 − DRIFT) / (1 + DRIFT)` of its clock, where `sent` is when it sent
   the last `Prepare` or `Renew` a quorum confirmed. It renews every `lease / 4`.

A slot its owner does not serve: the member the ring names next for it takes it too, once its
own acceptor heard no owner of the slot renew its lease, and no other member ask for it, for
a lease, while its links reach a quorum (`reaches_quorum`). That is who takes the slot when
its owner is gone; it covers an owner the ring still names because a minority still hears of
it, but that reaches no quorum (five-node seed 789036763). Refused for another's lease by a
quorum, it waits a lease before it asks again: that member serves the slot. A preparer that
heard from fewer than a quorum in a whole lease waits a lease before it asks again: its
promises are leases that keep the slot from the next member at those acceptors, and they
lapse meanwhile.

An owner *loses* a slot when its lease runs out (one acceptor's refusal does not end it while a
quorum renews); `Resign` then ends its lease where acceptors still hear it, and it asks again a
lease or a half later, as a preparer that heard from fewer than a quorum, or once it has heard
from a quorum of voters since. It *resigns* a slot when its ring names another member that a
quorum of acceptors reports as wanting it (refused for the lease): it stops first, then
`Resign` ends the lease promises, so the next owner need not wait them out. A member that
cannot reach a quorum never gets a slot resigned to it.

Writes (`write`) go to every voter; `CommitGate` holds back what depends on them.

Pure: `now` comes in; messages go out through the `Mailbox`, slot changes as events.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .acceptor import Acceptor
from .departures import Settling
from .ownership_messages import (
    Event,
    Gained,
    Lost,
    Mailbox,
    Prepare,
    Promise,
    Refuse,
    Renew,
    Renewed,
    Resign,
)
from .pace import Pace
from .placement import Placement
from .replication import Accept, CommitGate, Record, SlotWriter
from .slots import DRIFT, NO_BALLOT, SLOTS, Ballot

PREPARING, WRITING, ACTING = "preparing", "writing", "acting"


def latest(promises: Iterable[Promise]) -> Promise | None:
    """The promise with the latest copy: the largest (ballot, version) accepted."""
    return max(promises, key=lambda p: (p.accepted, p.version), default=None)


@dataclass
class OwnedSlot:
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
    # Taken as the member next after an owner that does not serve it (`unserved_from`): what
    # that owner would hand over is not on its way.
    takeover: bool = False
    # Member -> the acceptors that reported it asked for this slot in vain, and when.
    wanted: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class LeaseRound:
    """One `Renew` of every slot this node holds: when it went, under which ballots, and which
    acceptors confirmed each slot."""

    sent: float
    slots: dict[int, Ballot]
    confirmed: dict[int, set[str]] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)


class SlotLeases:
    """The slots this node takes, holds and gives up, under its own ballots and leases."""

    def __init__(
        self,
        me: str,
        *,
        life: int,
        lease: float,
        rng: random.Random,
        placement: Placement,
        acceptor: Acceptor,
        mail: Mailbox,
        events: list[Event],
        deadline_moved: Callable[[], None],
        choose_copy: Callable[[Iterable[Promise]], Promise | None],
        adopted: Callable[[list[Record]], list[Record]],
    ) -> None:
        """`life`: this life's generation, which the leases it is promised are for;
        `acceptor`: this node's own, which holds what it wrote; `events`: where `Gained` and
        `Lost` go; `deadline_moved`: called whenever a deadline of `deadlines` may have;
        `choose_copy`: which promised copy a new owner adopts (`latest`); `adopted`: what it
        writes of that copy's records."""
        self.me = me
        self.life = life
        self.lease = lease
        self.usable_lease = lease * (1 - DRIFT) / (1 + DRIFT)
        self._rng = rng
        self._placement = placement
        self._acceptor = acceptor
        self._mail = mail
        self._events = events
        self._deadline_moved = deadline_moved
        self._choose_copy = choose_copy
        self._adopted = adopted
        # The slots this node takes or holds.
        self.owned: dict[int, OwnedSlot] = {}
        # What its writes settled of each departed member (cluster/departures.py).
        self.settling = Settling()
        # Per slot, the largest ballot seen anywhere: a new one goes above it.
        self.seen = [NO_BALLOT] * SLOTS
        # When to try to take a slot again (after a refusal or a lost lease), and how long the
        # next wait after a refusal is (it doubles while refusals go on).
        self.retry_at = [-math.inf] * SLOTS
        self._backoff = [self.lease / 8] * SLOTS
        # Per slot this node is second for, since when (under its present owner), and when
        # that owner last resigned it, and the ballot it had acted under.
        self._second_since = [math.inf] * SLOTS
        self._handed: list[tuple[float, Ballot]] = [(-math.inf, NO_BALLOT)] * SLOTS
        # Slots waiting for their previous owner's promise before they adopt a state.
        self._awaiting_previous: set[int] = set()
        # Slots to resign once their writes are committed.
        self._to_resign: set[int] = set()
        # Slots whose lease ran out unrenewed, and when: taken again a lease or a half later,
        # or once a quorum of voters has been heard from since (`heard`). When each member
        # other than this one was last heard from.
        self._ran_out_at: dict[int, float] = {}
        self._heard_at: dict[str, float] = {}
        # The lease rounds sent within the last lease, by number; the last number; when the
        # next round goes.
        self._rounds: dict[int, LeaseRound] = {}
        self._next_round = 0
        self._renew_at = -math.inf
        self.pace = Pace(lease)
        # What waits for this node's writes to be committed.
        self.gate: CommitGate = CommitGate()
        # This node stops: it resigns every slot (once its writes are committed) and takes none.
        self.leaving = False
        # Counters, for metrics.
        self.gained = 0
        self.lost = 0
        self.resigned = 0

    # -- queries ----------------------------------------------------------------------------

    def acting_ballot(self, slot: int, now: float) -> Ballot | None:
        owned = self.owned.get(slot)
        if owned is not None and owned.phase == ACTING:
            if now < owned.lease_from + self.usable_lease:
                return owned.ballot
        return None

    def reaches_quorum(self, now: float) -> bool:
        return any(
            owned.phase == ACTING and now - owned.lease_from <= self.lease / 2
            for owned in self.owned.values()
        )

    def unserved_from(self, slot: int) -> float:
        """When this node, second for `slot`, takes it if nothing changes: a lease after its
        acceptor last heard an owner renew, or another member ask for the slot (it defers to a
        preparer it hears), or after this node became second for it; at once if the owner
        resigned it since."""
        since = max(self._acceptor.slots[slot].heard_at, self._second_since[slot])
        handed_at, _ = self._handed[slot]
        return handed_at if handed_at >= since else since + self.lease

    def _takes_over(self, now: float) -> list[int]:
        """The slots this node is second for that it may take now, leaving out when."""
        if not self.reaches_quorum(now):
            return []
        return [slot for slot in self._placement.seconded if slot not in self.owned]

    def deadlines(self, take: bool, now: float) -> list[float]:
        """When `tick` has something to do for the slots (`take`: it takes those it should):
        each deadline is one of `tick`'s conditions, or the actor would wake for nothing,
        again and again at one instant."""
        deadlines = [self._renew_at if self.owned or take else math.inf]
        for owned in self.owned.values():
            if owned.phase == ACTING:
                deadlines.append(owned.lease_from + self.usable_lease)
            elif owned.phase == PREPARING:
                deadlines.append(min(owned.prepared_at + self.lease, owned.ask_again_at))
            else:
                deadlines.append(owned.prepared_at + self.lease)
        deadlines.extend(
            self.owned[slot].prepared_at + self.lease / 2 for slot in self._awaiting_previous
        )
        if take:
            mine = self._placement.mine
            deadlines.extend(self.retry_at[slot] for slot in mine if slot not in self.owned)
            deadlines.extend(
                max(self.retry_at[slot], self.unserved_from(slot)) for slot in self._takes_over(now)
            )
        return deadlines

    # -- inputs -----------------------------------------------------------------------------

    def newly_mine(self, slots: list[int]) -> None:
        """The ring names this node for `slots` now: take them now, whatever they waited for."""
        for slot in slots:
            self.retry_at[slot] = -math.inf
            self._backoff[slot] = self.lease / 8

    def newly_seconded(self, slots: list[int], now: float) -> None:
        """The ring names this node next for `slots` now, after an owner it may not have heard
        from yet: a lease from now at the earliest, it takes those that owner does not serve."""
        for slot in slots:
            self._second_since[slot] = now

    def tick(self, era: int, ready: bool, now: float) -> None:
        """Lease ends, takes that waited long enough, resignations, takes and renewals."""
        for slot, owned in list(self.owned.items()):
            if owned.phase == ACTING and now >= owned.lease_from + self.usable_lease:
                self._lease_ran_out(slot, now)
            elif owned.phase == PREPARING and now >= owned.prepared_at + self.lease:
                self._give_up(slot, now, heard_from_quorum=self._heard_from_quorum(owned))
            elif owned.phase == WRITING and now >= owned.prepared_at + self.lease:
                self._give_up(slot, now)  # no quorum in a whole lease
            elif owned.phase == PREPARING and now >= owned.ask_again_at:
                self.lose(slot, now, resigned=False)
                self.retry_at[slot] = now
        for slot in list(self._awaiting_previous):
            awaiting = self.owned.get(slot)
            if awaiting is None or awaiting.phase != PREPARING:
                self._awaiting_previous.discard(slot)
            else:
                self._adopt_when_promised(slot, awaiting, era, now)
        if ready:
            if self.leaving:
                self._to_resign.update(self.owned)
            for slot in list(self._to_resign):
                self._resign(slot, now)
            if not self.leaving:
                for slot in self._placement.mine:
                    if slot not in self.owned and now >= self.retry_at[slot]:
                        self.prepare(slot, era, now)
                for slot in self._takes_over(now):
                    if now >= max(self.retry_at[slot], self.unserved_from(slot)):
                        self.prepare(slot, era, now)
                        self.owned[slot].takeover = True
            if (self.owned or not self.leaving) and now >= self._renew_at:
                self._renew(era, now)

    def see(self, slot: int, ballot: Ballot) -> None:
        if ballot > self.seen[slot]:
            self.seen[slot] = ballot

    def write(self, slot: int, records: list[Record], gone: list[int | str], now: float) -> None:
        owned = self.owned[slot]
        assert owned.writer is not None  # it acts for the slot
        write = Accept(slot, owned.ballot, owned.writer.next_version(now), False, records, gone)
        self.gate.written(slot, write.version)
        self._mail.to_all(self._placement.voters, write)

    def handed_over(self, slot: int, ballot: Ballot, now: float) -> None:
        """The owner under `ballot` resigned `slot`, a ballot that acted: take it now if it is
        this node's, or if this node is second for it after that owner."""
        named = self._placement.ring_owners[slot]
        if named == self.me:
            if slot not in self.owned:
                self.retry_at[slot] = now
        elif named == ballot.member and slot in self._placement.seconded:
            self._handed[slot] = (now, ballot)
            self.retry_at[slot] = now
        else:
            return
        self._deadline_moved()

    def lose_all(self, now: float) -> None:
        for slot in list(self.owned):
            self.lose(slot, now, resigned=False)

    # -- taking a slot ----------------------------------------------------------------------

    def prepare(self, slot: int, era: int, now: float) -> None:
        self._ran_out_at.pop(slot, None)
        seen = self.seen[slot]
        ballot = Ballot(era, seen.number + 1 if seen.era == era else 1, self.me)
        self.seen[slot] = ballot
        self.owned[slot] = OwnedSlot(ballot, PREPARING, now)
        self._deadline_moved()
        self._mail.to_all(self._placement.voters, Prepare(slot, ballot, self.life))

    def on_answer(self, sender: str, answer: Promise | Refuse, era: int, now: float) -> None:
        """An acceptor's answer to a `Prepare` or `Accept` of this node's."""
        slot = answer.slot
        owned = self.owned.get(slot)
        if owned is None or answer.ballot != owned.ballot:
            return
        if isinstance(answer, Refuse):
            if answer.lease_left > 0 and owned.phase == PREPARING:
                owned.refused_by_lease.add(sender)
                owned.lease_left = max(owned.lease_left, answer.lease_left)
                resigned = answer.promised == self._handed[slot][1]
                if owned.takeover and not resigned and self._served_by_another(owned):
                    self.lose(slot, now, resigned=False)
                    self.retry_at[slot] = now + self.lease * self._rng.uniform(1.0, 1.5)
                    return
                self._ask_again_after_leases(slot, owned, now)
            elif answer.promised > owned.ballot and owned.phase == PREPARING:
                self._give_up(slot, now)
            # A refused write of a slot this node holds: it stays committed by the others of
            # the quorum, and the lease ends the slot if a quorum has moved on.
            return
        if owned.phase == PREPARING:
            owned.promises[sender] = answer
            self._adopt_when_promised(slot, owned, era, now)
            if owned.phase == PREPARING and self.owned.get(slot) is owned:
                self._ask_again_after_leases(slot, owned, now)

    def _ask_again_after_leases(self, slot: int, owned: OwnedSlot, now: float) -> None:
        """A quorum answered but too few promised, some because another member's lease runs
        there: that member resigns once a quorum tells it this node asked (and its ring
        agrees), else the lease ends within `lease_left`: ask again then, not a whole lease
        later. Checked whichever answer comes last: with acceptors' clocks at different rates,
        one lease ends before another, and a promise can follow a refusal (seed 567534553
        with skew: a slot waited two seconds, and a heartbeated lease ran out). Until then the
        ballot stays open: the voters that have not answered yet may still make a quorum."""
        voters, quorum = self._placement.voters, self._placement.quorum
        answered = (owned.refused_by_lease | owned.promises.keys()) & voters
        if not owned.refused_by_lease or len(answered) < quorum:
            return
        if len(owned.promises.keys() & voters) >= quorum:
            return
        if owned.ask_again_at == math.inf:
            wait = min(owned.lease_left, self.lease / 4)
            owned.ask_again_at = now + wait * self._rng.uniform(1.0, 1.1)
            self._deadline_moved()

    def _adopt_when_promised(self, slot: int, owned: OwnedSlot, era: int, now: float) -> None:
        placement = self._placement
        promises = owned.promises
        if len(promises.keys() & placement.voters) < placement.quorum:
            return
        best = self._choose_copy(p for p in promises.values() if p.accepted.era == era)
        previous = best.accepted.member if best is not None else None
        if (
            previous not in (None, self.me)
            and not owned.takeover
            and previous not in promises
            and previous in placement.live
            and previous not in placement.recovering
            and now < owned.prepared_at + self.lease / 2
        ):
            # What it hands over comes ahead of its promise: wait a little for it.
            self._awaiting_previous.add(slot)
            return
        self._awaiting_previous.discard(slot)
        self._deadline_moved()
        records = self._adopted(list(best.records)) if best is not None else []
        owned.adopted = best.accepted if best is not None else NO_BALLOT
        owned.cold = best is None
        owned.phase = WRITING
        owned.lease_from = owned.prepared_at
        owned.writer = SlotWriter(slot, owned.ballot, now, self.usable_lease)
        write = Accept(slot, owned.ballot, owned.writer.next_version(now), True, records, [])
        self.gate.written(slot, write.version)
        self._mail.to_all(placement.voters, write)

    def _served_by_another(self, owned: OwnedSlot) -> bool:
        """A quorum refused this node for another member's lease: that member holds the slot,
        however silent it is toward this node's acceptor (a cut between the two alone). A
        takeover asks again a lease later, not every quarter lease while the cut lasts."""
        return len(owned.refused_by_lease & self._placement.voters) >= self._placement.quorum

    def _heard_from_quorum(self, owned: OwnedSlot) -> bool:
        answered = owned.promises.keys() | owned.refused_by_lease
        return len(answered & self._placement.voters) >= self._placement.quorum

    def _give_up(self, slot: int, now: float, heard_from_quorum: bool = True) -> None:
        """Stop taking `slot` under this ballot; try again later, later each time. Heard
        from fewer than a quorum, a lease later: what promised meanwhile leased the slot to this
        node at those acceptors, and keeps it from a member that reaches a quorum."""
        self.lose(slot, now, resigned=False)
        wait = self._backoff[slot]
        self._backoff[slot] = min(2 * wait, self.lease / 2)
        if heard_from_quorum:
            self.retry_at[slot] = now + wait * self._rng.uniform(0.5, 1.0)
        else:
            self.retry_at[slot] = now + self.lease * self._rng.uniform(1.0, 1.5)

    def _lease_ran_out(self, slot: int, now: float) -> None:
        """No quorum renewed `slot`'s lease in time: act no more, end the lease where acceptors
        still hear this node (`lose`), and ask again a lease or a half later, or as soon as a
        quorum of voters has been heard from since. Asked sooner, only the minority that still
        hears it would answer, and each promise there is a lease that keeps the slot from the
        member next in the ring, which may reach a quorum (five-node seed 733965563); asked later
        than a quorum is heard, the slot waits for nothing, for the member next in the ring
        defers to the one the ring names (seed 307983834)."""
        self._give_up(slot, now, heard_from_quorum=False)
        self._ran_out_at[slot] = now

    def heard(self, sender: str, now: float) -> None:
        """A message from `sender` arrived: the link from it flows."""
        self._heard_at[sender] = now
        if not self._ran_out_at:
            return
        ended = {at for at in set(self._ran_out_at.values()) if self._heard_from_quorum_since(at)}
        for slot in [slot for slot, at in self._ran_out_at.items() if at in ended]:
            del self._ran_out_at[slot]
            self.retry_at[slot] = min(self.retry_at[slot], now)
            self._deadline_moved()

    def _heard_from_quorum_since(self, since: float) -> bool:
        heard = {m for m, at in self._heard_at.items() if at >= since} | {self.me}
        return len(heard & self._placement.voters) >= self._placement.quorum

    def on_accepted(self, sender: str, slot: int, ballot: Ballot, version: int, now: float) -> None:
        owned = self.owned.get(slot)
        if owned is None or owned.writer is None or owned.ballot != ballot:
            return
        writer = owned.writer
        if writer.held(sender, version, now):
            copy = self._acceptor.slots[slot].copy
            if copy.accepted == ballot:
                write = Accept(slot, ballot, copy.version, True, copy.records(now), [])
                self._mail.send(sender, write)
        committed = writer.committed(self._placement.voters, now)
        self.gate.committed(slot, committed)
        self.settling.committed(slot, writer.committed_first_sent)
        if slot in self._to_resign:
            self._resign(slot, now)
            if slot not in self.owned:
                return  # dropped while still being taken (no `Lost`): never gained
        if owned.phase == WRITING and committed >= 1:
            if now >= owned.lease_from + self.usable_lease:
                # Committed only after the lease it was taken under ran out (this node was
                # paused, say): another may have taken the slot and written since, and what
                # this node adopted lacks it. Not gained, even for a moment.
                self._give_up(slot, now)
                return
            owned.phase = ACTING
            self._backoff[slot] = self.lease / 8
            self._deadline_moved()
            self.gained += 1
            records = self._acceptor.slots[slot].copy.records(now)
            self._events.append(Gained(slot, ballot, owned.adopted, records, owned.cold))

    # -- keeping a slot ---------------------------------------------------------------------

    def _renew(self, era: int, now: float) -> None:
        self._renew_at = now + self.lease / 4
        self._deadline_moved()
        slots = {s: o.ballot for s, o in self.owned.items() if o.phase != PREPARING}
        self._next_round += 1
        self._rounds[self._next_round] = LeaseRound(now, slots)
        for number in [n for n, r in self._rounds.items() if r.sent < now - self.lease]:
            del self._rounds[number]
        numbers = [ballot.number for ballot in slots.values()]
        self._mail.to_all(
            self._placement.voters,
            Renew(self._next_round, era, list(slots), numbers, self.pace.slow, self.life),
        )
        self._resend_uncommitted(now)

    def _resend_uncommitted(self, now: float) -> None:
        """A write no quorum acknowledged yet goes again, whole, to the live voters that have
        said nothing newer for half a lease: its Accept or their Accepted may have been lost
        with a broken link, and without a later write nothing else would tell (what waits on
        it would wait for good). Not sooner: under a stream of writes most slots have one on
        its way at any time, and sending them all whole every round clogged the links until
        the members counted each other down (100,000 peers made at one node of three)."""
        voters = self._placement.voters
        for slot, owned in self.owned.items():
            writer = owned.writer
            if writer is None:
                continue
            copy = self._acceptor.slots[slot].copy
            if copy.accepted != owned.ballot:
                continue
            if not writer.pending(voters, now):
                if self.settling.unmarked(slot):
                    # A member departed since this slot was last written: its copies went
                    # with it, and a new life reads as if it had not gone until this write
                    # is committed by the voters that remain (cluster/departures.py). The
                    # acceptors missing what it follows say so, and get the slot whole.
                    version = writer.next_version(now)
                    self._mail.to_all(voters, Accept(slot, owned.ballot, version, False, [], []))
                continue
            if now - writer.sent_at(writer.version) >= self.usable_lease / 2:
                # Its acceptors' words are half spent (`SlotWriter.committed`): before they
                # run out, an empty write follows, whose words count afresh. One that does
                # not hold what it follows says so, and gets the slot whole.
                version = writer.next_version(now)
                self._mail.to_all(voters, Accept(slot, owned.ballot, version, False, [], []))
                continue
            stalled = writer.stalled(voters & self._placement.live.keys(), now, self.lease / 2)
            if not stalled:
                continue
            write = Accept(slot, owned.ballot, copy.version, True, copy.records(now), [])
            for member in stalled:
                writer.sent_whole(member, now)
                self._mail.send(member, write)

    def on_renewed(self, sender: str, answer: Renewed, now: float) -> bool:
        """An acceptor's answer to a `Renew`, after what it says of ballots was seen: did this
        node's pace change?"""
        for slot, member in zip(answer.wanted, answer.wanted_by, strict=True):
            owned = self.owned.get(slot)
            if owned is not None:
                owned.wanted.setdefault(member, {})[sender] = now
                self._consider_resigning(slot, now)
        round_ = self._rounds.get(answer.round)
        if round_ is None:
            return False
        need = self._placement.quorum
        for slot in answer.renewed:
            owned = self.owned.get(slot)
            if owned is None or round_.slots.get(slot) != owned.ballot:
                continue
            confirmed = round_.confirmed.setdefault(slot, set())
            confirmed.add(sender)
            if len(confirmed & self._placement.voters) >= need and round_.sent > owned.lease_from:
                owned.lease_from = round_.sent
                self._deadline_moved()
        reached = len(round_.answered & self._placement.voters) >= need
        round_.answered.add(sender)
        if reached or len(round_.answered & self._placement.voters) < need:
            return False
        return self.pace.round_trip(round_.sent, now)

    # -- giving a slot up -------------------------------------------------------------------

    def _consider_resigning(self, slot: int, now: float) -> None:
        """A quorum of acceptors reported who asked for `slot`: resign it if that is the
        member this node's ring names for it."""
        owned = self.owned.get(slot)
        designated = self._placement.ring_owners[slot]
        if owned is None or designated in (None, self.me):
            return
        asked = owned.wanted.get(designated, {})
        recent = {member for member, at in asked.items() if at > now - self.lease}
        if len(recent & self._placement.voters) >= self._placement.quorum:
            self._to_resign.add(slot)
            self._resign(slot, now)

    def _resign(self, slot: int, now: float) -> None:
        """Resign `slot` once its writes are committed, so that what was said of it stands."""
        owned = self.owned.get(slot)
        if owned is None or (not self.leaving and self._placement.ring_owners[slot] == self.me):
            self._to_resign.discard(slot)
            return
        if owned.writer is not None and owned.writer.pending(self._placement.voters, now):
            return
        self._to_resign.discard(slot)
        self.lose(slot, now, resigned=True)

    def lose(self, slot: int, now: float, resigned: bool) -> None:
        """Act for `slot` no more (or stop taking it), and end the leases its ballot holds
        wherever acceptors hear this node: a promise left running keeps the slot from every
        other member for a lease (five-node seed 492644394)."""
        owned = self.owned.pop(slot)
        self._mail.to_all(self._placement.voters, Resign(slot, owned.ballot))
        self._deadline_moved()
        self._to_resign.discard(slot)
        self._awaiting_previous.discard(slot)
        self.gate.lost(slot)
        if not resigned:
            self.retry_at[slot] = now + self._backoff[slot] * self._rng.uniform(0.5, 1.0)
        if owned.phase == ACTING:
            self.lost += 1
            self.resigned += resigned
            self._events.append(Lost(slot, owned.ballot, resigned))
