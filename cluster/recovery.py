"""A new life's way to becoming an acceptor (docs/cluster.md, "New lives, and a cold start",
"Which life a vote belongs to", "Eras across cold starts").

A new life answers as an acceptor only once it has (a) waited out the leases its previous life
may have promised (the *quarantine*) and (b) *recovered*: read every slot from enough other
voters that are ready to share a member with every quorum its previous life was in (n − q + 1
of the n voters, q a quorum), keeping the largest copy and promise of each. When a quorum of
voters has nothing to read from (a cold start), one of them proposes a new *era*
(`ColdStart`); not-ready members accept the largest proposal, ready ones refuse it, and a
proposal a quorum accepted makes its acceptors ready in that era, empty. Decisions wait `settle`
seconds from the start, to learn the voters first, unless the membership heard from every
member it knows of (`knows_the_voters`).

`Recovery.step` first ends a life that accepted a cold start that won (`ColdStarted`): it is
ready in that era, empty, once it knows the voters (`StartCold`). Otherwise it asks every voter
it has not read yet (`Recover`), and the first of `RULES` whose condition holds decides:

| condition          | the life                                                             |
|--------------------|----------------------------------------------------------------------|
| `_settling`        | waits: it learns the voters first                                    |
| `_in_quarantine`   | waits: a lease of its previous life may run                          |
| `_read_enough`     | adopts what n − q + 1 ready others hold (`Recovered`); n counts the  |
|                    | departed members not yet settled (cluster/departures.py)             |
| `_proposed`        | once a quorum accepted its proposal, starts its era (`ColdWon`)      |
| `_too_few_blank`   | waits: fewer than `_cold_quorum` are new lives with nothing: a       |
|                    | quorum of the voters it knows and of its seeds of no member it knows |
| `_always`          | proposes an era above every floor it heard of (`ColdStart`)          |

Pure: `now` comes in; messages go out through the `Mailbox`, decisions come back as values.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from .departures import Departed, reads_needed
from .ownership_messages import (
    ColdAnswer,
    ColdStart,
    ColdStarted,
    Mailbox,
    Prepare,
    Recover,
    RecoverReply,
    SlotImage,
)
from .slots import DRIFT_RATIO, NO_BALLOT, SLOTS, Ballot

# A recovering life asks again this often.
RECOVER_RETRY = 0.5


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


class _Reading:
    """A new life's reading of the others' slots, and its cold-start proposal, if any."""

    def __init__(self) -> None:
        # member -> the nonce of the last `Recover` sent it, and when
        self.asked: dict[str, tuple[int, float]] = {}
        self.replies: dict[str, _Reply] = {}
        self.proposal: Ballot | None = None
        self.accepted_by: set[str] = set()
        # No proposal before then (a larger one was accepted elsewhere: let it win).
        self.propose_after = -math.inf


@dataclass(frozen=True, slots=True)
class _Heard:
    """What a step of recovery goes by: the voters and a quorum of them, the others, those
    read (`Recovery._reads`), and those that answered as a new life with nothing."""

    voters: frozenset[str]
    quorum: int
    others: list[str]
    read: list[str]
    blank: list[str]


# -- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartCold:
    """A cold start this life accepted won: it is ready in `era`, empty."""

    era: int


@dataclass(frozen=True, slots=True)
class ColdWon:
    """A quorum accepted this life's proposal: it is ready in its era, empty; then it tells
    those that accepted (`announce`)."""

    proposal: Ballot
    accepted_by: frozenset[str]


@dataclass(frozen=True, slots=True)
class Recovered:
    """The read is done: per slot, the largest promise and the latest copy of `era`."""

    era: int
    promised: list[Ballot]
    best: list[SlotImage | None]


Decision = StartCold | ColdWon | Recovered


class Recovery:
    """A new life's quarantine, recovery read and cold start, and what it keeps of them once
    ready: the cold starts it accepted and started (`kept_era`, late `ColdAnswer`s)."""

    def __init__(
        self,
        me: str,
        *,
        life: int,
        lease: float,
        settle: float,
        era_floor: int,
        rng: random.Random,
        mail: Mailbox,
        deadline_moved: Callable[[], None],
        now: float,
    ) -> None:
        """`life`: this life's generation, told in each `Recover`; `settle`: how long a new life
        learns the voters before it decides anything; `era_floor`: the least era a cold start
        this life takes part in may pick (above the era its previous lives kept on disk, if the
        node keeps one, and at least the wall clock in milliseconds)."""
        self.me = me
        self._life = life
        self._rng = rng
        self._mail = mail
        self._deadline_moved = deadline_moved
        self._era_floor = era_floor
        self.quarantine_until = now + lease * DRIFT_RATIO
        self.settle_until = now + settle
        # The membership heard from every member it knows of (`knows_the_voters`).
        self.voters_known = False
        # Seeds that belong to no member this life knows of (`Ownership.unknown_seeds`): each
        # may be a voter it has not heard of.
        self.unknown_seeds = 0
        # Departed members not yet settled (`Ownership.departures_changed`): its read counts
        # them, not answering.
        self.departed: frozenset[Departed] = frozenset()
        self._reading: _Reading | None = _Reading()
        self.recover_at = now
        # The largest cold-start proposal this life accepted, the one it started, and one that
        # won while this life did not know the voters yet (it starts once it does).
        self.accepted_cold = Ballot(era_floor, 0, "")
        self.started_cold: Ballot | None = None
        self._cold_started: Ballot | None = None
        # (sender, slot) -> the latest prepare of a member before this life was ready:
        # answered once it is (at most one per member and slot).
        self.early_prepares: dict[tuple[str, int], Prepare] = {}

    def deadlines(self, now: float) -> list[float]:
        """When `step` has something to do next (while the life recovers)."""
        deadlines = [d for d in (self.settle_until, self.quarantine_until) if d > now]
        deadlines.append(self.recover_at)
        return deadlines

    def knows_the_voters(self, now: float) -> None:
        self.voters_known = True
        self.settle_until = min(self.settle_until, now)

    def ready(self) -> None:
        """This life is ready: the reading is over."""
        self._reading = None

    def joins(self, answer: ColdAnswer) -> bool:
        """Does `answer` come from a member that accepted the cold start this node won? It
        starts with it."""
        started = self.started_cold
        return started is not None and answer.accepted == answer.proposal == started

    def step(self, voters: frozenset[str], quorum: int, now: float) -> Decision | None:
        """Ask, read and decide (the table above, `RULES`)."""
        if self._cold_started is not None and self._cold_started == self.accepted_cold:
            # Ready only once it knows the voters: with members it had not heard of yet, it
            # would count a quorum of them alone.
            if now >= self.settle_until:
                return StartCold(self._cold_started.era)
            return None
        reading = self._reading
        assert reading is not None  # it recovers until it is ready
        others = sorted(voters - {self.me})
        read = [m for m in others if (r := reading.replies.get(m)) and self._reads(r)]
        blank = [m for m in others if (r := reading.replies.get(m)) and not r.ready]
        heard = _Heard(voters, quorum, others, read, blank)
        self._ask(reading, heard, now)
        for holds, then in RULES:
            if holds(self, heard, now):
                return then(self, heard, now)
        return None

    def _ask(self, reading: _Reading, heard: _Heard, now: float) -> None:
        """A member just learned of is asked at once, the rest every `RECOVER_RETRY` until
        read, and those that sent their copies too early again once the quarantine is over."""
        again = now >= self.recover_at
        if again:
            self.recover_at = now + RECOVER_RETRY
            self._deadline_moved()
        for member in heard.others:
            reply = reading.replies.get(member)
            last_asked = reading.asked.get(member, (0, now))[1]
            early = reply is not None and reply.ready and last_asked < self.quarantine_until <= now
            if (again or member not in reading.asked or early) and member not in heard.read:
                nonce = self._rng.getrandbits(63)
                reading.asked[member] = (nonce, now)
                self._mail.send(member, Recover(nonce, self._life))

    # -- the rules' conditions ---------------------------------------------------------------

    def _settling(self, heard: _Heard, now: float) -> bool:
        return now < self.settle_until

    def _in_quarantine(self, heard: _Heard, now: float) -> bool:
        """The quarantine waits out leases the previous life promised to a member acting on
        them; with every voter known and a new life with nothing, none acts
        (docs/cluster.md)."""
        nobody_acts = self.voters_known and len(heard.blank) == len(heard.others)
        return now < self.quarantine_until and not nobody_acts

    def _read_enough(self, heard: _Heard, now: float) -> bool:
        """Any quorum that held the previous life holds at least `quorum - 1` of the others,
        so this many ready others share a member with it (docs/cluster.md); a member departed
        since it may have been in such a quorum too, and counts, not answering, until its
        departure is settled (cluster/departures.py)."""
        needed = reads_needed(len(heard.voters), len(self.departed))
        return bool(heard.read) and len(heard.read) >= needed

    def _proposed(self, heard: _Heard, now: float) -> bool:
        return self._reading is not None and self._reading.proposal is not None

    def _too_few_blank(self, heard: _Heard, now: float) -> bool:
        return len(heard.blank) + 1 < self._cold_quorum(heard)

    def _always(self, heard: _Heard, now: float) -> bool:
        return True

    # -- the rules' actions ------------------------------------------------------------------

    def _wait(self, heard: _Heard, now: float) -> None:
        return None

    def _adopt(self, heard: _Heard, now: float) -> Recovered:
        """Per slot, the largest promise and the latest copy of the largest era read."""
        assert self._reading is not None
        replies = [self._reading.replies[member] for member in heard.read]
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
        return Recovered(era, promised, best)

    def _cold_quorum(self, heard: _Heard) -> int:
        """How many must start an era: a quorum of the voters it knows, and of those with every
        seed that belongs to no member it knows. The voters it knows are those the lives it
        heard from know, and new lives that heard only of each other know only each other: a
        quorum of them alone may be a minority of the cluster (docs/cluster.md, "A life that
        knows nobody")."""
        return max(heard.quorum, (len(heard.voters) + self.unknown_seeds) // 2 + 1)

    def _count_acceptances(self, heard: _Heard, now: float) -> ColdWon | None:
        reading = self._reading
        assert reading is not None and reading.proposal is not None
        if len(reading.accepted_by & heard.voters) >= self._cold_quorum(heard):
            self.started_cold = reading.proposal
            return ColdWon(reading.proposal, frozenset(reading.accepted_by))
        return None

    def _propose(self, heard: _Heard, now: float) -> None:
        """The smallest id proposes first, the others only if it has not won meanwhile:
        proposals of all at once split the acceptors, and none may win."""
        reading = self._reading
        assert reading is not None
        if reading.propose_after == -math.inf:
            rank = sorted([*heard.blank, self.me]).index(self.me)
            reading.propose_after = now + rank * RECOVER_RETRY
        if now >= reading.propose_after:
            eras = [reply.era for reply in reading.replies.values()]
            era = max(self._era_floor, self.accepted_cold.era, *eras) + 1
            reading.proposal = Ballot(era, 0, self.me)
            self.accepted_cold = reading.proposal
            reading.accepted_by = {self.me}
            for member in heard.others:
                self._mail.send(member, ColdStart(reading.proposal))

    def announce(self, won: ColdWon) -> None:
        for member in sorted(won.accepted_by - {self.me}):
            self._mail.send(member, ColdStarted(won.proposal))

    def _reads(self, reply: _Reply) -> bool:
        """Does `reply` count in the recovery read? Only a whole copy from a ready member,
        asked for once the quarantine was over: a quorum that held this member's previous
        life may still be forming before then, its other members not yet holding what they
        will have accepted (docs/cluster.md, "Which life a vote belongs to")."""
        return reply.ready and reply.complete and reply.asked_at >= self.quarantine_until

    # -- messages ---------------------------------------------------------------------------

    def on_recover_reply(self, sender: str, reply: RecoverReply) -> bool:
        """Part of an answer to this life's `Recover`: is it one to take into account?"""
        reading = self._reading
        if reading is None:
            return False
        nonce, asked_at = reading.asked.get(sender, (None, 0.0))
        if nonce != reply.nonce:
            return False
        known = reading.replies.get(sender)
        if known is None or known.nonce != reply.nonce:
            known = _Reply(reply.nonce, asked_at, reply.ready, reply.era, reply.parts)
            reading.replies[sender] = known
        known.images[reply.part] = reply.images
        return True

    def on_cold_start(self, sender: str, proposal: Ballot, ready: bool) -> None:
        if ready:
            self._mail.send(sender, ColdAnswer(proposal, NO_BALLOT, True))
            return
        self.accepted_cold = max(self.accepted_cold, proposal)
        self._mail.send(sender, ColdAnswer(proposal, self.accepted_cold, False))

    def on_cold_answer(self, sender: str, answer: ColdAnswer, now: float) -> bool:
        """An answer to this life's `ColdStart`: is it one to take into account?"""
        reading = self._reading
        accepted = not answer.ready and answer.accepted == answer.proposal
        if reading is None and accepted and answer.proposal == self.started_cold:
            # Accepted after the quorum did: it starts in the era too, as those did.
            self._mail.send(sender, ColdStarted(answer.proposal))
            return False
        if reading is None or reading.proposal != answer.proposal:
            return False
        if answer.ready or answer.accepted != answer.proposal:
            # Someone has state (recover from the ready ones), or a larger proposal is accepted
            # there (let it win), or its floor is above this proposal (go above it next time).
            self._era_floor = max(self._era_floor, answer.accepted.era)
            reading.proposal = None
            reading.propose_after = now + self._rng.uniform(RECOVER_RETRY, 2 * RECOVER_RETRY)
            return False
        reading.accepted_by.add(sender)
        return True

    def on_cold_started(self, proposal: Ballot, ready: bool) -> bool:
        """A cold start won: is it the one this life accepted?"""
        if not ready and self.accepted_cold == proposal:
            self._cold_started = proposal
            return True
        return False


Condition = Callable[[Recovery, _Heard, float], bool]
Action = Callable[[Recovery, _Heard, float], Decision | None]

# What a recovering life does once it asked: the first rule whose condition holds decides.
RULES: tuple[tuple[Condition, Action], ...] = (
    (Recovery._settling, Recovery._wait),
    (Recovery._in_quarantine, Recovery._wait),
    (Recovery._read_enough, Recovery._adopt),
    (Recovery._proposed, Recovery._count_acceptances),
    (Recovery._too_few_blank, Recovery._wait),
    (Recovery._always, Recovery._propose),
)
