"""Who should take each slot, and where to send what a slot needs (docs/cluster.md, "O1: ballots
and leases", "New lives, and a cold start", "Routing").

The ring names a live member for each slot, over the members that are not recovering: a member
back from a crash before its old leases ran out would otherwise keep its slots from everyone
until its own recovery ends, a lease and more later. What a member sent last says whether it
recovers (`FROM_RECOVERING`); a life this node learns of, once it is ready itself, recovers
until it sends something only a ready life sends. A new life heard of only through gossip
(its links to this node cut) would otherwise be named for its slots by the ready verdict of
the life before it, while it cannot become ready: five-node seed 309768660.

Pure: `now` comes in.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from .ownership_messages import (
    Accept,
    Accepted,
    ColdStart,
    ColdStarted,
    Prepare,
    Promise,
    Recover,
    Refuse,
    Renew,
    Renewed,
    Resign,
)
from .replication import quorum as quorum_of
from .ring import Ring
from .slots import SLOTS, slot_owners, slot_successors

# What a message says of its sender: True, its life is recovering (it answers as no acceptor
# yet); False, it is ready (only a ready life sends these). `RecoverReply` and `ColdAnswer`
# say which themselves.
FROM_RECOVERING: dict[type, bool] = {
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


class Placement:
    """The members as this node sees them, the ring over them, and routing hints."""

    def __init__(self, me: str) -> None:
        self.me = me
        # Live members: id -> life.
        self.live: dict[str, int] = {}
        # Members whose life is recovering, by what they sent last (`FROM_RECOVERING`).
        self.recovering: set[str] = set()
        # Members whose last renewal said their rounds are slow (this node too, by its own):
        # the ring leaves them out while others remain (cluster/pace.py).
        self.slow: set[str] = set()
        # The last life of each member this node knew live: one counted down that comes back
        # as the same life is not a new one.
        self._lives: dict[str, int] = {}
        # Members not gone for good: their acceptors make the quorums.
        self.voters: frozenset[str] = frozenset({me})
        self.quorum = 1
        # Per slot, the member the ring names (who should take it).
        self.ring_owners: list[str | None] = [None] * SLOTS
        # The slots the ring names this node for, while it can take them.
        self.mine: list[int] = []
        # The slots the ring names this node next for, while it can take them: it takes one
        # whose owner does not serve it (`SlotLeases`, "A slot its owner does not serve").
        self.seconded: list[int] = []
        # Per slot this node is second for, or was second for before the ring named it, the
        # owner's life it is second after: a flap of this node's view (the owner counted down,
        # this node named, the owner up again) names it next after the same life again, and
        # that is not a new owner (five-node seed 733564309).
        self._second_after: list[tuple[str, int] | None] = [None] * SLOTS
        # Slot -> the member an acceptor that refused this node said holds its lease, and until
        # when (for routing only).
        self.lessees: dict[int, tuple[str, float]] = {}

    def members_changed(
        self, live: Mapping[str, int], voters: Collection[str], ready: bool
    ) -> None:
        known = self._lives
        self.slow = {m for m in self.slow if m == self.me or known.get(m) == live.get(m)}
        if ready:
            self.recovering.update(
                member
                for member, life in live.items()
                if member != self.me and known.get(member) != life
            )
        known.update(live)
        self.live = dict(live)
        self.voters = frozenset(voters) | {self.me}
        self.quorum = quorum_of(self.voters)

    def heard(self, sender: str, recovering: bool) -> bool:
        """`sender`'s life recovers (or is ready): did that change?"""
        return _mark(self.recovering, sender, recovering)

    def paced(self, member: str, slow: bool) -> bool:
        """`member`'s rounds are slow (or not): did that change?"""
        return _mark(self.slow, member, slow)

    def designate(self, ready: bool) -> tuple[list[int], list[int]]:
        """Name a live member for each slot, and the member next after it: the ring over those
        not recovering (this node too, while it recovers: what it is asked meanwhile goes to
        those that can act), and not slow while others remain. Returns the slots newly this
        node's, and those it is newly second for (or second for after another owner, or
        another life of it)."""
        named = self.live.keys() - self.recovering
        if not ready and named - {self.me}:
            named -= {self.me}
        if named - self.slow:
            named -= self.slow
        ring = Ring(named)
        mine_before = set(self.mine)
        self.ring_owners = slot_owners(ring)
        # Only a quorum of live members can take a slot: alone, this node names itself for
        # every slot, and would ask for all of them in vain.
        if len(self.live.keys() & self.voters) >= self.quorum:
            self.mine = [s for s, owner in enumerate(self.ring_owners) if owner == self.me]
            self.seconded = [s for s, next_ in enumerate(slot_successors(ring)) if next_ == self.me]
        else:
            self.mine, self.seconded = [], []
        newly_mine = [slot for slot in self.mine if slot not in mine_before]
        return newly_mine, self._newly_seconded()

    def _newly_seconded(self) -> list[int]:
        seconded, newly = set(self.seconded), []
        for slot, owner in enumerate(self.ring_owners):
            if slot in seconded:
                assert owner is not None
                after = (owner, self.live[owner])
                if after != self._second_after[slot]:
                    self._second_after[slot] = after
                    newly.append(slot)
            elif owner != self.me:
                self._second_after[slot] = None
        return newly

    def heard_lessee(self, slot: int, lessee: str, until: float) -> None:
        self.lessees[slot] = (lessee, until)

    def actor_of(self, slot: int, acting: bool, lease_holder: str | None, now: float) -> str | None:
        """Where to send what `slot` needs: this node if it acts for it (`acting`); else, the
        holder of the lease this node's acceptor promised, while it runs (`lease_holder`);
        else the lessee a refusal named, while its lease runs; else the member the ring names
        (it is taking the slot, or will). Never this node for a lease it heard of but does not
        act under: that is its own prepare, which did not win (or whose lease it let go), and
        serving here would answer 503 while another member acts (docs/cluster.md,
        "Routing")."""
        if acting:
            return self.me
        if lease_holder != self.me and lease_holder in self.live:
            return lease_holder
        lessee, until = self.lessees.get(slot, (None, -math.inf))
        if lessee != self.me and lessee in self.live and now < until:
            return lessee
        return self.ring_owners[slot]


def _mark(members: set[str], member: str, marked: bool) -> bool:
    """Put `member` in `members`, or take it out: did that change?"""
    if (member in members) == marked:
        return False
    if marked:
        members.add(member)
    else:
        members.discard(member)
    return True
