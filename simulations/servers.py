"""What the nodes themselves did with their slots, for the checkers that judge the servers and
not only what the clients saw (simulations/checkers.py, `o2`).

A tap on each life's `Ownership` (cluster/ownership.py) records, without changing what it does:

* every write the life sent as an owner (`Accept` in its outbox, its own ballot): version,
  whether it was whole, and each record it carried (its key and what it says) or dropped;
* every version its `CommitGate` was told is committed, and under which ballot (the ballot of
  the life's latest own write of that slot: a gate is told only of the writer's versions);
* every `Gained`: the records the life acts on from then on, as the copy it adopted held them
  (its first write raised every peer's next ticket).

Records are kept as signatures, taken when they pass: a peer's remaining lifetime shrinks as a
copy ages, so it is left out of what a peer record says. Nothing goes into the history's
events, so a run's trace (and its hash) stays as it was without the tap.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import trio

from sluicegate.cluster.ownership import Gained
from sluicegate.cluster.peers import TICKET_GAP, PeerRecord
from sluicegate.cluster.replication import Accept
from sluicegate.cluster.slots import Ballot

# A node's life: (node id, generation).
Life = tuple[str, int]
# What a record says, as a hashable value (`signature`).
Signature = tuple


def adopted(record):
    """A gained record as the copy adopted held it: a new owner raised every peer's next
    ticket in its first write (cluster/peers.py, `raise_tickets`)."""
    if isinstance(record, PeerRecord):
        return replace(record, next_ticket=record.next_ticket - TICKET_GAP)
    return record


def signature(record) -> Signature:
    """What `record` says, but for what changes as copies age (a peer's `expires_in`)."""
    values = []
    for item in fields(record):
        if isinstance(record, PeerRecord) and item.name == "expires_in":
            continue
        value = getattr(record, item.name)
        values.append(tuple(value.items()) if hasattr(value, "items") else value)
    return (type(record).__name__, *values)


@dataclass
class Write:
    """One version an owner sent of a slot."""

    at: float
    version: int
    whole: bool
    records: dict[object, Signature]
    gone: tuple


@dataclass
class Writer:
    """One life's writes of one slot under one ballot, and the highest version committed."""

    life: Life
    slot: int
    ballot: Ballot
    writes: dict[int, Write] = field(default_factory=dict)
    committed: int = 0
    committed_at: float = 0.0

    def state(self, version: int) -> dict[object, Signature] | None:
        """The slot's records as of `version` (None: a write on the way there was not seen)."""
        state: dict[object, Signature] = {}
        for number in range(1, version + 1):
            write = self.writes.get(number)
            if write is None:
                return None
            if write.whole:
                state = dict(write.records)
                continue
            for key in write.gone:
                state.pop(key, None)
            state.update(write.records)
        return state


@dataclass
class Gain:
    at: float
    life: Life
    slot: int
    ballot: Ballot
    previous: Ballot
    records: dict[object, Signature]
    cold: bool


class ServerLog:
    """Every life's writers and gains, over a whole run."""

    def __init__(self) -> None:
        self.writers: dict[tuple[Life, int, Ballot], Writer] = {}
        self.gains: list[Gain] = []
        # The latest ballot each life wrote each slot under (what its gate's versions are of).
        self._writing: dict[tuple[Life, int], Ballot] = {}

    def tap(self, node_id: str, generation: int, ownership) -> None:
        """Record what `ownership` (one life's) writes, commits and gains, from now on."""
        life = (node_id, generation)
        outbox, events, committed = ownership.outbox, ownership.events, ownership.gate.committed

        def tapped_outbox():
            messages = outbox()
            for _, message in messages:
                if isinstance(message, Accept) and message.ballot.member == node_id:
                    self._sent(life, message)
            return messages

        def tapped_events():
            happened = events()
            for event in happened:
                if isinstance(event, Gained):
                    records = {record.key: signature(adopted(record)) for record in event.records}
                    self.gains.append(
                        Gain(
                            trio.current_time(),
                            life,
                            event.slot,
                            event.ballot,
                            event.previous,
                            records,
                            event.cold,
                        )
                    )
            return happened

        def tapped_committed(slot: int, version: int) -> None:
            committed(slot, version)
            ballot = self._writing.get((life, slot))
            if ballot is None or version < 1:
                return
            writer = self.writers[life, slot, ballot]
            if version > writer.committed:
                writer.committed, writer.committed_at = version, trio.current_time()

        ownership.outbox = tapped_outbox
        ownership.events = tapped_events
        ownership.gate.committed = tapped_committed

    def _sent(self, life: Life, write: Accept) -> None:
        key = (life, write.slot, write.ballot)
        writer = self.writers.get(key)
        if writer is None:
            writer = self.writers[key] = Writer(life, write.slot, write.ballot)
        self._writing[life, write.slot] = write.ballot
        if write.version in writer.writes:
            return  # sent again (whole, to one that lagged): the same version says the same
        writer.writes[write.version] = Write(
            trio.current_time(),
            write.version,
            write.whole,
            {record.key: signature(record) for record in write.records},
            tuple(write.gone),
        )
