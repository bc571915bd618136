"""The acceptor of every slot (docs/cluster.md, "O1: ballots and leases", "O2: quorum writes"):
per slot, the largest ballot it promised, its copy of the slot (`SlotCopy`), and at most one
running *lease promise* (a member's life, a ballot, until when by its clock).

It answers `Prepare` (a promise, which leases the slot to the preparer, or a refusal saying
why), `Renew`, `Accept` and `Resign`, and gives its whole state to a recovering life
(`Recover`). Only a ready life answers (`Ownership` holds back the others); what it is told of
ballots goes first to the owner's side, which may start a larger era (`Ownership._see`).

Pure: `now` comes in; each answer goes back as a value.
"""

from __future__ import annotations

import math

from .ownership_messages import Promise, Refuse, Renewed, SlotImage
from .replication import PART_RECORDS, Accept, Accepted, SlotCopy
from .slots import NO_BALLOT, SLOTS, Ballot


def era_floor(era: int) -> Ballot:
    """The least ballot of `era`: what an acceptor promises at least once it is in it."""
    return Ballot(era, 0, "")


class SlotAcceptor:
    """One slot's promise, lease promise and copy."""

    __slots__ = (
        "promised",
        "copy",
        "lessee",
        "lessee_life",
        "lease_ballot",
        "lease_until",
        "wanted",
        "heard_at",
    )

    def __init__(self) -> None:
        self.promised = NO_BALLOT
        self.copy = SlotCopy()
        self.lessee: str | None = None
        self.lessee_life = 0
        self.lease_ballot = NO_BALLOT
        self.lease_until = -math.inf
        # Members refused for the lease since the lessee last heard of it.
        self.wanted: set[str] = set()
        # When an owner last renewed its lease here, or another member than this node asked
        # for the slot (`SlotLeases.unserved_from`).
        self.heard_at = -math.inf

    def leased_to_other(self, member: str, now: float) -> bool:
        return self.lessee not in (None, member) and now < self.lease_until

    def lease(self, ballot: Ballot, life: int, now: float, duration: float) -> None:
        if self.lessee != ballot.member:
            self.wanted.clear()
        self.promised = max(self.promised, ballot)
        self.lessee, self.lessee_life = ballot.member, life
        self.lease_ballot, self.lease_until = ballot, now + duration


class Acceptor:
    """`me` as the acceptor of every slot; `lease`: how long a lease promise lasts."""

    def __init__(self, me: str, lease: float) -> None:
        self.me = me
        self.lease = lease
        self.slots = [SlotAcceptor() for _ in range(SLOTS)]
        # Per member, the latest of its lives that asked this acceptor to recover.
        self._recovered: dict[str, int] = {}

    def prepare(
        self, slot: int, ballot: Ballot, life: int, era: int, now: float
    ) -> Promise | Refuse:
        acceptor = self.slots[slot]
        if ballot.member != self.me:
            acceptor.heard_at = now
        if ballot <= acceptor.promised or ballot.era < era or self._gone(ballot.member, life):
            return Refuse(slot, ballot, max(acceptor.promised, era_floor(era)), 0.0)
        if acceptor.leased_to_other(ballot.member, now):
            acceptor.wanted.add(ballot.member)
            left = acceptor.lease_until - now
            return Refuse(slot, ballot, acceptor.promised, left, acceptor.lessee or "")
        acceptor.lease(ballot, life, now, self.lease)
        copy = acceptor.copy
        return Promise(slot, ballot, copy.accepted, copy.version, copy.records(now))

    def renew(
        self, number: int, slots: list[int], ballots: list[Ballot], life: int, now: float
    ) -> Renewed:
        """Extend the leases of an owner's slots (of its life `life`); tell it who asked for
        them in vain."""
        renewed, refused, promised, wanted, wanted_by = [], [], [], [], []
        # An owner's ballots are its own: one member, one life.
        gone = bool(ballots) and self._gone(ballots[0].member, life)
        for slot, ballot in zip(slots, ballots, strict=True):
            acceptor = self.slots[slot]
            # Refused or not: its owner is alive, and the member next in the ring leaves it be.
            acceptor.heard_at = now
            if gone or ballot < acceptor.promised or acceptor.leased_to_other(ballot.member, now):
                refused.append(slot)
                promised.append(acceptor.promised)
                continue
            acceptor.lease(ballot, life, now, self.lease)
            renewed.append(slot)
            for member in sorted(acceptor.wanted):
                wanted.append(slot)
                wanted_by.append(member)
            acceptor.wanted.clear()
        return Renewed(number, renewed, refused, promised, wanted, wanted_by)

    def accept(self, write: Accept, now: float) -> Accepted | Refuse:
        acceptor = self.slots[write.slot]
        if write.ballot < acceptor.promised:
            return Refuse(write.slot, write.ballot, acceptor.promised, 0.0)
        acceptor.promised = write.ballot
        copy = acceptor.copy
        applied = copy.apply(write, now)
        held = copy.version if applied and copy.accepted == write.ballot else 0
        return Accepted(write.slot, write.ballot, held)

    def recovering(self, member: str, life: int) -> None:
        """`member`'s life `life` asks to recover. Only a life that is not ready asks, so it
        holds no lease, and one life per node id runs at a time: the leases promised here to
        its earlier lives end now, and those lives are refused from now on (docs/cluster.md,
        "A lease ends with its life")."""
        if life <= self._recovered.get(member, life - 1):
            return
        self._recovered[member] = life
        for acceptor in self.slots:
            if acceptor.lessee == member and acceptor.lessee_life < life:
                acceptor.lease_until = -math.inf

    def _gone(self, member: str, life: int) -> bool:
        """Is `life` earlier than a life of `member` that asked this acceptor to recover?"""
        return life < self._recovered.get(member, life)

    def resign(self, slot: int, ballot: Ballot) -> None:
        """The owner under `ballot` gave `slot` up: its lease promise ends now."""
        acceptor = self.slots[slot]
        if acceptor.lessee == ballot.member and acceptor.lease_ballot == ballot:
            acceptor.lease_until = -math.inf

    def images(self, now: float) -> list[list[SlotImage]]:
        """Every slot's state, for a recovering life, in parts of about `PART_RECORDS`
        records."""
        parts: list[list[SlotImage]] = [[]]
        size = 0
        for slot, acceptor in enumerate(self.slots):
            copy = acceptor.copy
            if size + len(copy) > PART_RECORDS and parts[-1]:
                parts.append([])
                size = 0
            parts[-1].append(
                SlotImage(slot, acceptor.promised, copy.accepted, copy.version, copy.records(now))
            )
            size += len(copy) + 1
        return parts

    def lease_holder(self, slot: int, now: float) -> str | None:
        """While the lease this acceptor promised for `slot` runs: its lessee, or the writer of
        a larger ballot it accepted since (that one won a quorum after the promise)."""
        acceptor = self.slots[slot]
        if now >= acceptor.lease_until:
            return None
        written = acceptor.copy.accepted
        return written.member if written > acceptor.lease_ballot else acceptor.lessee

    # -- a life's eras -----------------------------------------------------------------------

    def start_empty(self, era: int) -> None:
        """A cold start: every slot empty in `era`."""
        for acceptor in self.slots:
            acceptor.promised = era_floor(era)
            acceptor.copy.clear()

    def enter_era(self, era: int) -> None:
        """A larger era started elsewhere: what this acceptor holds of an older one could not
        have been committed since (docs/cluster.md), and is dropped."""
        for acceptor in self.slots:
            acceptor.promised = max(acceptor.promised, era_floor(era))
            if acceptor.copy.accepted.era < era:
                acceptor.copy.clear()

    def restore(
        self, era: int, promised: list[Ballot], best: list[SlotImage | None], now: float
    ) -> None:
        """A recovered life: per slot, the largest promise and the latest copy it read."""
        for slot, acceptor in enumerate(self.slots):
            acceptor.promised = max(promised[slot], era_floor(era))
            adopted = best[slot]
            if adopted is None:
                acceptor.copy.clear()
            else:
                acceptor.copy.replace(adopted.accepted, adopted.version, adopted.records, now)
