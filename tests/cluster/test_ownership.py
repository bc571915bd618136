"""Ownership of slots (`cluster/ownership.py` and its parts) and quorum writes
(`cluster/replication.py`), without trio or sockets: the invariants of docs/cluster.md checked by
`tests/cluster/ownership_model.py` under loss, repeats, partitions one and two ways, pauses,
crashes and skewed clocks, with planted bugs to show the checks have teeth; then the pieces one
by one."""

from __future__ import annotations

import heapq
import random

import pytest

from sluicegate.cluster import acceptor as acceptor_module
from sluicegate.cluster import ownership as ownership_module
from sluicegate.cluster import placement as placement_module
from sluicegate.cluster.ownership import (
    ColdAnswer,
    ColdStart,
    ColdStarted,
    Gained,
    Message,
    Ownership,
    Prepare,
    Promise,
    Ready,
    Recover,
    RecoverReply,
    Refuse,
    Renew,
    Renewed,
    Resign,
)
from sluicegate.cluster.peers import PeerRecord
from sluicegate.cluster.replication import Accept, Accepted, CommitGate, SlotCopy, SlotWriter
from sluicegate.cluster.ring import Ring
from sluicegate.cluster.semaphore_leases import LockRecord, SemaphoreRecord, lock_key
from sluicegate.cluster.slots import DRIFT, NO_BALLOT, SLOTS, Ballot
from tests.cluster.ownership_model import (
    LEASE,
    Model,
    forget_then_crash,
    overlapping_run,
    random_run,
    restart_behind_a_slow_quorum,
)
from tests.collector import held


def record(key: int) -> PeerRecord:
    return PeerRecord(key, 60.0, 60.0, {}, None, 0, {}, {}, 1, 0)


# -- the invariants, over many schedules ------------------------------------------------------


# 1132: a write committed after its lease ran out gained a slot from a stale state.
@pytest.mark.parametrize("seed", [*range(8), 1132])
def test_three_nodes_keep_one_acting_owner_per_slot_and_every_committed_write(seed):
    model = random_run(seed)
    assert model.violations == []
    assert model.serving() == [], "every slot served again once the faults are over"
    assert model.writes > 500 and model.gains > 256


@pytest.mark.parametrize("seed", range(3))
def test_five_nodes_keep_one_acting_owner_per_slot_and_every_committed_write(seed):
    model = random_run(100 + seed, nodes=5)
    assert model.violations == []
    assert model.serving() == []


@pytest.mark.parametrize("seed", range(4))
def test_faults_that_overlap_on_a_minority_keep_both_invariants(seed):
    model = overlapping_run(seed, nodes=5 if seed % 2 else 3)
    assert model.violations == []
    assert model.serving() == []


@pytest.mark.parametrize("pick", range(3))
def test_a_vote_of_a_life_that_restarted_behind_a_slow_quorum_loses_no_committed_write(pick):
    """Issue 38's schedule: the write was committed with the acceptance of X's old life and
    of C over a slow link, after X's new life read C. Its read now comes after the quarantine,
    by when a quorum counted with the old life's word had formed."""
    model, slot, key = restart_behind_a_slow_quorum(0, pick)
    assert key in model.committed[slot], "the schedule commits the write"
    assert model.violations == []
    assert model.serving() == []


@pytest.mark.parametrize("pick", range(3))
def test_a_departure_then_a_crash_loses_no_committed_write(pick):
    """docs/cluster.md, "A departure, then a crash": the write was committed by O, X and F of
    five; F is forgotten and X restarts. Its new life reads as with five voters until every
    slot has been written again without F, and so waits for O, which alone holds it."""
    model, slot, key = forget_then_crash(0, pick)
    assert key in model.committed[slot], "the schedule commits the write"
    assert model.violations == []
    assert model.serving() == []
    # Every slot was written again without F: the read is back to two of four.
    assert all(life.departures[1] == frozenset() for life in model.lives.values() if life)


def cut_off_the_owner_mid_round(seed: int) -> Model:
    """n1's clock runs as slow as DRIFT allows, the acceptors' as fast; n1 is cut off at a
    random moment of its renewal round, and the others notice at once: they ask for its slots
    the moment their lease promises end."""
    model = Model(seed, rates={"n1": 1 - DRIFT, "n2": 1 + DRIFT, "n3": 1 + DRIFT}, down_after=0.3)
    model.run_until(4.0 + model.rng.uniform(0, LEASE / 4))
    model.isolate("n1")
    model.run_until(model.t + 3 * LEASE)
    return model


@pytest.mark.parametrize("seed", range(3))
def test_an_owner_cut_off_stops_before_another_takes_its_slots_at_the_drift_bound(seed):
    model = cut_off_the_owner_mid_round(seed)
    assert model.violations == []
    assert model.serving() == []


def test_a_lease_a_tenth_longer_than_the_rule_allows_is_caught(monkeypatch):
    original = Ownership.__init__

    def overlong(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.usable_lease = self.lease * 1.1

    monkeypatch.setattr(Ownership, "__init__", overlong)
    assert cut_off_the_owner_mid_round(1).violations


@pytest.mark.parametrize(
    "plant",
    ["acceptors ignore leases", "a quorum one short", "adopt the oldest copy"],
)
def test_the_model_catches_planted_bugs(monkeypatch, plant):
    if plant == "acceptors ignore leases":
        monkeypatch.setattr(
            acceptor_module.SlotAcceptor, "leased_to_other", lambda self, member, now: False
        )
    elif plant == "a quorum one short":
        monkeypatch.setattr(placement_module, "quorum_of", lambda voters: len(voters) // 2)
    else:
        monkeypatch.setattr(
            ownership_module,
            "latest",
            lambda promises: min(promises, key=lambda p: (p.accepted, p.version), default=None),
        )
    assert random_run(3).violations


# -- lives and eras --------------------------------------------------------------------------


def test_a_cluster_starting_cold_agrees_on_one_era_and_takes_every_slot():
    model = Model(7)
    model.run_until(5.0)
    eras = {life.core.era for life in model.lives.values()}
    assert len(eras) == 1 and eras != {0}
    assert all(life.core.ready for life in model.lives.values())
    assert model.serving() == []


def test_a_cold_start_that_heard_every_member_waits_out_neither_settle_nor_quarantine():
    """Settle (down_after, 1 s here) and the quarantine (a lease, 1 s) are there to learn the
    voters and to outlast promises of earlier lives: once every member answered, as a new
    life with nothing, neither is needed."""
    model = Model(7)
    model.run_until(0.5)
    assert all(life.core.ready for life in model.lives.values())
    model.run_until(1.0)
    assert model.serving() == [] and model.violations == []


def test_a_cold_start_that_has_not_heard_a_member_waits_them_out():
    model = Model(7)
    model.crash("n3")  # silent from the start: n1 and n2 know of it, as seeds of theirs
    model.run_until(0.9)
    assert not any(life.core.ready for life in model.lives.values() if life is not None)
    model.run_until(3.0)
    assert all(life.core.ready for life in model.lives.values() if life is not None)
    assert model.violations == []


def test_a_restarted_node_recovers_the_era_and_what_its_old_life_held():
    model = Model(8)
    model.run_until(5.0)
    era = model.lives["n1"].core.era
    committed = {slot: set(keys) for slot, keys in model.committed.items() if keys}
    assert committed
    model.crash("n2")
    model.run_until(7.0)
    model.start("n2")
    life = model.lives["n2"]
    model.run_until(7.5)
    assert not life.core.ready, "a new life waits out the leases of its previous one"
    model.run_until(12.0)
    assert life.core.ready and life.core.era == era  # recovered, no new era
    for slot, keys in committed.items():
        # The model's writes only add records: whatever was committed before the crash is in
        # the copy the new life recovered (or in a later one of the slot).
        copy = {r.key for r in life.core.acceptor.slots[slot].copy.records(0.0)}
        assert keys <= copy, f"slot {slot} lost committed writes in the recovered copy"
    assert model.violations == [] and model.serving() == []


def test_a_node_back_from_a_crash_before_its_leases_ended_does_not_keep_its_slots_unserved():
    """Its new life recovers for a lease and more (it waits out its old leases first), and the
    others hear from it all along: they still take its slots as soon as its old leases end,
    since a recovering member is named for no slot; it takes them back once ready. Meanwhile
    it sends what it is asked for those slots to the members acting for them (seed 319419215:
    it refused heartbeats itself, and a lease ran out)."""
    model = Model(11)
    model.run_until(5.0)
    n2_slots = set(model.lives["n2"].core.acting_slots(model.lives["n2"].local(model.t)))
    assert n2_slots
    model.crash("n2")
    model.run_until(5.3)
    model.start("n2")
    model.run_until(5.0 + LEASE * (1 + 2 * DRIFT) + 0.2)
    assert not model.lives["n2"].core.ready
    assert model.serving() == [], "the others act for every slot of n2's old life"
    actors = {
        slot: name
        for name, life in model.lives.items()
        for slot in life.core.acting_slots(life.local(model.t))
    }
    n2 = model.lives["n2"]
    assert {slot: n2.core.actor_of(slot, n2.local(model.t)) for slot in n2_slots} == {
        slot: actors[slot] for slot in n2_slots
    }
    model.run_until(12.0)
    life = model.lives["n2"]
    assert life.core.ready and life.core.serves_share(life.local(model.t))
    assert model.violations == [] and model.serving() == []


def test_a_new_life_heard_of_only_through_gossip_is_named_for_no_slot_until_it_is_heard_ready():
    """Its links to this node are cut, so its `Recover` never comes here: named by the ready
    verdict of the life before it, it kept its slots from everyone while it could not become
    ready itself (five-node seed 309768660, a lease lost)."""
    core = Ownership(
        "n1", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    voters = {"n1", "n2", "n3"}
    core.members_changed({m: 1 for m in voters}, voters, 0.0)
    core._become_ready(5, 0.0, cold=True)
    n2_slots = [s for s in range(SLOTS) if core.owner_of(s) == "n2"]
    assert n2_slots
    core.members_changed({"n1": 1, "n2": 2, "n3": 1}, voters, 1.0)
    assert not any(core.owner_of(s) == "n2" for s in range(SLOTS))
    assert {core.owner_of(s) for s in n2_slots} <= {"n1", "n3"}
    core.receive("n2", Renew(1, 5, [], [], False, 1), 1.1)  # only a ready life renews
    assert [s for s in range(SLOTS) if core.owner_of(s) == "n2"] == n2_slots
    core.members_changed({"n1": 1, "n3": 1}, voters, 1.2)  # n2 counted down...
    core.members_changed({"n1": 1, "n2": 2, "n3": 1}, voters, 1.3)  # ... and back, that life
    assert [s for s in range(SLOTS) if core.owner_of(s) == "n2"] == n2_slots, "a life known"


def test_a_new_life_answers_nothing_as_an_acceptor_before_it_is_ready():
    core = Ownership(
        "n1", life=1, lease=1.0, settle=1.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core.members_changed({"n1": 1, "n2": 1, "n3": 1}, {"n1", "n2", "n3"}, 0.0)
    core.outbox()
    core.receive("n2", Prepare(3, Ballot(5, 1, "n2"), 1), 0.1)
    core.receive("n2", Renew(1, 5, [3], [1], False, 1), 0.1)
    core.receive("n2", Accept(3, Ballot(5, 1, "n2"), 1, True, [], []), 0.1)
    assert [m for _, m in core.outbox() if not isinstance(m, Recover)] == []
    core.receive("n2", Recover(9, 1), 0.1)
    assert core.outbox() == [("n2", RecoverReply(9, False, 5, [], 0, 1))]


def test_a_cold_start_goes_above_the_floor_of_every_member_whatever_the_proposers_clock():
    """Fencing tokens start at the era: a proposer whose clock is behind the last era (and
    whose disk, if any, is gone) still proposes above what the others kept."""
    core = Ownership(
        "n1", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    voters = {"n1", "n2", "n3"}
    core.members_changed({m: 1 for m in voters}, voters, 0.0)
    core.knows_the_voters(0.0)
    asked = {to: m.nonce for to, m in core.outbox() if isinstance(m, Recover)}
    core.receive("n2", RecoverReply(asked["n2"], False, 9, [], 0, 1), 0.01)
    core.receive("n3", RecoverReply(asked["n3"], False, 3, [], 0, 1), 0.01)
    proposals = {m.proposal for _, m in core.outbox() if isinstance(m, ColdStart)}
    assert proposals == {Ballot(10, 0, "n1")}


def test_a_new_life_refuses_a_cold_start_at_or_below_its_floor_and_the_proposer_goes_above():
    n2 = Ownership("n2", life=1, lease=1.0, settle=0.0, era_floor=9, rng=random.Random(1), now=0.0)
    n2.receive("n1", ColdStart(Ballot(8, 0, "n1")), 0.1)
    ((_, refusal),) = n2.outbox()
    assert refusal == ColdAnswer(Ballot(8, 0, "n1"), Ballot(9, 0, ""), False)
    n2.receive("n1", ColdStart(Ballot(10, 0, "n1")), 0.2)
    assert n2.outbox() == [("n1", ColdAnswer(Ballot(10, 0, "n1"), Ballot(10, 0, "n1"), False))]
    assert n2.kept_era == 10


@pytest.mark.parametrize("seed", range(3))
def test_two_of_three_restarted_at_once_start_a_new_era_within_a_bounded_time(seed):
    """A majority lost its memory: nothing can be read from a quorum of ready members, so the
    new lives start a new era and the member still up drops its older state for it."""
    model = Model(seed)
    model.run_until(5.0)
    era = model.lives["n3"].core.era
    model.crash("n1")
    model.crash("n2")
    model.run_until(5.2)
    model.start("n1")
    model.start("n2")
    took = model.run_until_ready()
    assert took <= 3 * LEASE
    model.run_until(model.t + LEASE)  # the member still up hears the new era from a new life
    (new_era,) = {life.core.era for life in model.lives.values()}
    assert new_era > era
    model.run_until(model.t + 2 * LEASE)
    assert model.serving() == []


@pytest.mark.parametrize("restarted, nodes", [(["n2"], 3), (["n4", "n5"], 5)])
@pytest.mark.parametrize("seeded", [True, False])
def test_lives_restarted_cut_off_from_most_members_start_no_era_of_their_own(
    restarted, nodes, seeded
):
    """New lives that hear only each other know only each other: a cold start among them
    would be a quorum of a minority, an era the others would take up, empty, once the cut
    heals (found by the simulations: one life of three by the overlap kind, two of five that
    heard each other by the deep sweep). With seeds, those it has not heard from count as
    voters, and it waits for them; the planted case (`seeded=False`, as the first node of a
    cluster, which has no seeds) shows the model sees what that costs."""
    ids = [f"n{i}" for i in range(1, nodes + 1)]
    model = Model(12, nodes=nodes, start=ids)
    model.run_until(5.0)
    era = model.lives["n1"].core.era
    for node in restarted:
        model.crash(node)
        for other in set(ids) - set(restarted):
            model.partition(node, other)
    for node in restarted:
        model.start(node, seeded=seeded)
    model.run_until(10.0)
    lives = [model.lives[node] for node in restarted]
    if not seeded:
        assert all(life.core.ready and life.core.era > era for life in lives)
        model.heal()
        model.run_until(20.0)
        assert model.violations, "the others took up its era, empty"
        return
    assert not any(life.core.ready for life in lives)
    model.heal()
    model.run_until(20.0)
    assert all(life.core.ready and life.core.era == era for life in lives)
    assert model.violations == [] and model.serving() == []


def test_a_ready_node_refuses_a_cold_start_and_the_proposer_recovers_instead():
    core = Ownership(
        "n1", life=1, lease=1.0, settle=1.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core._become_ready(7, 0.0, cold=True)
    core.events()
    core.receive("n2", ColdStart(Ballot(9, 0, "n2")), 0.5)
    assert core.outbox() == [("n2", ColdAnswer(Ballot(9, 0, "n2"), NO_BALLOT, True))]


def test_a_cold_start_won_before_this_node_knew_the_voters_waits_until_it_does():
    """Links can bring a cold start before gossip brings its members: ready then, a node
    counting itself as the only voter took all 256 slots alone beside the others."""
    core = Ownership(
        "n3", life=1, lease=3.0, settle=3.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    proposal = Ballot(9, 0, "n1")
    core.receive("n1", ColdStart(proposal), 0.1)
    assert core.outbox() == [("n1", ColdAnswer(proposal, proposal, False))]
    core.receive("n1", ColdStarted(proposal), 0.2)
    assert not core.ready
    core.members_changed({"n1": 1, "n2": 1, "n3": 1}, {"n1", "n2", "n3"}, 0.3)
    assert not core.ready
    core.knows_the_voters(0.4)
    assert core.ready and core.era == 9 and core.events() == [Ready(9, cold=True)]


def test_a_write_committed_after_its_lease_ran_out_gains_nothing():
    """A node paused between its write and the answers: the others took the slot and wrote
    meanwhile, and the answers it woke to made it gain from what it had adopted, without those
    writes (model seed 1132)."""
    core = Ownership(
        "n1", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core.members_changed({"n1": 1, "n2": 1, "n3": 1}, {"n1", "n2", "n3"}, 0.0)
    core._become_ready(5, 0.0, cold=True)
    core.tick(0.0)
    prepares = [m for _, m in core.outbox() if isinstance(m, Prepare)]
    slot, ballot = prepares[0].slot, prepares[0].ballot
    core.receive("n2", Promise(slot, ballot, NO_BALLOT, 0, []), 0.01)
    write = next(m for _, m in core.outbox() if isinstance(m, Accept) and m.slot == slot)
    core.events()
    core.receive("n2", Accepted(slot, ballot, write.version), 5.0)
    assert not any(isinstance(e, Gained) for e in core.events())
    assert slot not in core.acting_slots(5.0)


def test_a_larger_era_seen_drops_what_an_older_one_left():
    core = Ownership(
        "n1", life=1, lease=1.0, settle=1.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core._become_ready(7, 0.0, cold=True)
    core.receive("n2", Accept(3, Ballot(7, 1, "n2"), 1, True, [record(1)], []), 0.1)
    assert len(core.acceptor.slots[3].copy) == 1
    core.receive("n3", Prepare(4, Ballot(8, 1, "n3"), 1), 0.2)
    assert core.era == 8 and len(core.acceptor.slots[3].copy) == 0


# -- pieces ----------------------------------------------------------------------------------


def test_an_acceptor_refuses_a_ballot_while_it_leases_the_slot_to_another_member():
    core = Ownership(
        "n1", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core._become_ready(5, 0.0, cold=True)
    core.receive("n2", Prepare(3, Ballot(5, 1, "n2"), 1), 1.0)
    assert isinstance(core.outbox()[0][1], Promise)
    core.receive("n3", Prepare(3, Ballot(5, 2, "n3"), 1), 1.5)
    ((_, refusal),) = core.outbox()
    assert isinstance(refusal, Refuse) and refusal.lease_left == pytest.approx(0.5)
    # The lessee renews and hears who asked; once it resigns, the other gets the slot at once.
    core.receive("n2", Renew(1, 5, [3], [1], False, 1), 1.6)
    ((_, renewed),) = core.outbox()
    assert renewed == Renewed(1, [3], [], [], [3], ["n3"])
    core.receive("n2", Resign(3, Ballot(5, 1, "n2")), 1.7)
    core.receive("n3", Prepare(3, Ballot(5, 2, "n3"), 1), 1.7)
    assert isinstance(core.outbox()[0][1], Promise)
    # A smaller ballot is refused whatever the leases.
    core.receive("n2", Prepare(3, Ballot(5, 1, "n2"), 1), 9.0)
    assert core.outbox()[0][1].promised == Ballot(5, 2, "n3")


def test_a_promise_after_a_refusal_for_a_lease_asks_again_when_the_lease_ends():
    """Its own acceptor refused for n1's lease, which ends in 0.1 s; n2, its clock ahead,
    promised: the preparer asks again within a quarter lease, not after a whole one."""
    core = Ownership(
        "n3", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core.members_changed({"n3": 1}, {"n1", "n2", "n3"}, 0.0)  # alone: it prepares nothing
    core._become_ready(5, 0.0, cold=True)
    core.receive("n1", Prepare(3, Ballot(5, 1, "n1"), 1), 0.0)  # leased to n1 until 1.0
    core.leases.prepare(3, core.era, 0.9)
    core._drain(0.9)  # refused by its own acceptor: one answer of a quorum of two
    ballot = core.leases.owned[3].ballot
    core.receive("n2", Promise(3, ballot, NO_BALLOT, 0, []), 0.95)
    asks_again_at = core.leases.owned[3].ask_again_at
    assert asks_again_at <= 0.95 + 0.1 * 1.1
    core.tick(asks_again_at)
    assert 3 not in core.leases.owned and core.leases.retry_at[3] == asks_again_at


def preparing_slot_3_of_five() -> tuple[Ownership, Ballot]:
    """n5, ready among five voters, preparing slot 3: its own acceptor promised."""
    core = Ownership(
        "n5", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core.members_changed({"n5": 1}, {"n1", "n2", "n3", "n4", "n5"}, 0.0)
    core._become_ready(5, 0.0, cold=True)
    core.leases.prepare(3, core.era, 0.0)
    core._drain(0.0)
    return core, core.leases.owned[3].ballot


def test_a_promise_after_a_refusal_for_a_lease_still_counts_towards_the_quorum():
    """Five voters: its own acceptor and n2 promised, n3 refused for n1's lease, and n4's
    promise comes after the refusal: three promises are a quorum, and it adopts the slot
    (five-node seed 1835274876 gave up on n3's refusal and left the slot unserved 3.9 s)."""
    core, ballot = preparing_slot_3_of_five()
    core.receive("n2", Promise(3, ballot, NO_BALLOT, 0, []), 0.01)
    core.receive("n3", Refuse(3, ballot, Ballot(5, 1, "n1"), 0.5, "n1"), 0.01)
    assert core.leases.owned[3].phase == "preparing"
    core.receive("n4", Promise(3, ballot, NO_BALLOT, 0, []), 0.02)
    assert core.leases.owned[3].phase == "writing" and core.leases.owned[3].ballot == ballot


def test_a_slot_written_after_a_refusal_for_a_lease_sets_no_deadline_its_tick_ignores():
    """The refusal set a time to ask again; the promises that followed made a quorum, and the
    slot is being written. Asking again is for a slot still preparing: reported as a deadline
    here, `tick` did nothing at it and the shard actor woke for it again and again at one
    instant (five-node seed 789036822 spun for 120 s of CPU at 20.4 s)."""
    core, ballot = preparing_slot_3_of_five()
    core.receive("n2", Promise(3, ballot, NO_BALLOT, 0, []), 0.01)
    core.receive("n3", Refuse(3, ballot, Ballot(5, 1, "n1"), 0.5, "n1"), 0.01)
    core.receive("n4", Promise(3, ballot, NO_BALLOT, 0, []), 0.02)
    owned = core.leases.owned[3]
    assert owned.phase == "writing" and owned.ask_again_at < 0.5 < owned.prepared_at + 1.0
    core.tick(0.5)
    assert core.next_deadline() > 0.5


def two_of_three_without_n1() -> tuple[dict[str, Ownership], int]:
    """n2 and n3, ready, hear of n1 (gossip keeps it live) but never from it; they take their
    own slots at 0. Returns them, and a slot the ring names n1 for, and n2 next."""
    cores = {}
    for me in ("n2", "n3"):
        core = Ownership(
            me, life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
        )
        core.members_changed({"n1": 1, "n2": 1, "n3": 1}, {"n1", "n2", "n3"}, 0.0)
        core._become_ready(5, 0.0, cold=True)
        cores[me] = core
    exchange(cores, 0.0)
    ring = Ring({"n1", "n2", "n3"})
    slot = next(s for s in range(SLOTS) if ring.preference_list(b"slot/%d" % s, 2) == ["n1", "n2"])
    return cores, slot


def exchange(cores: dict[str, Ownership], now: float) -> None:
    """Tick the cores at `now` and hand their messages to each other until none is left
    (those to n1 are lost)."""
    for core in cores.values():
        core.tick(now)
    while True:
        mail = [(core.me, to, message) for core in cores.values() for to, message in core.outbox()]
        if not mail:
            return
        for sender, to, message in mail:
            if to in cores:
                cores[to].receive(sender, message, now)


def run_until(cores: dict[str, Ownership], end: float, step: float = 0.05) -> None:
    run_until_from(cores, 0.0, end, step)


def run_until_from(cores: dict[str, Ownership], now: float, end: float, step: float = 0.05) -> None:
    while now < end:
        now = round(now + step, 6)
        exchange(cores, now)


def test_the_member_next_in_the_ring_takes_a_slot_whose_owner_it_has_not_heard_for_a_lease():
    """Five-node seed 789036763: the slot's owner reached no quorum, a minority kept it live,
    and every ring kept naming it; nobody asked for its slots until the cut healed."""
    cores, slot = two_of_three_without_n1()
    n2 = cores["n2"]
    assert n2.reaches_quorum(0.0) and not n2.acting(slot, 0.0)
    assert n2.next_deadline() <= 1.0  # (the takeover is one of tick's deadlines)
    run_until(cores, 0.95)
    assert slot not in n2.leases.owned
    run_until(cores, 1.2)
    assert n2.acting(slot, 1.2) and n2.owner_of(slot) == "n1"


def test_the_member_next_in_the_ring_defers_a_lease_to_another_member_that_asks():
    cores, slot = two_of_three_without_n1()
    n2 = cores["n2"]
    run_until(cores, 0.5)
    n2.receive("n1", Prepare(slot, Ballot(5, 9, "n1"), 1), 0.5)  # promised, a lease to n1
    run_until(cores, 1.45)
    assert slot not in n2.leases.owned
    run_until(cores, 1.7)
    assert n2.acting(slot, 1.7)


def test_the_member_next_in_the_ring_hears_an_owner_whose_renewals_its_acceptor_refuses():
    """Its acceptor promised a larger ballot (it asked once, in vain) and refuses n1's renewals:
    n1 still lives, and n2 does not ask again and again (counting only the renewals granted,
    the ownership model's runs sent twice the messages)."""
    cores, slot = two_of_three_without_n1()
    n2 = cores["n2"]
    n2.acceptor.slots[slot].promised = Ballot(5, 9, "n2")
    now, round_ = 0.0, 0
    while now < 3.0:
        now = round(now + 0.05, 6)
        if now >= round_ * 0.25:
            round_ += 1
            n2.receive("n1", Renew(round_, 5, [slot], [1], False, 1), now)
        exchange(cores, now)
    assert slot not in n2.leases.owned


def test_the_member_next_in_the_ring_refused_by_a_quorum_for_the_owners_lease_waits_a_lease():
    cores, slot = two_of_three_without_n1()
    n2 = cores["n2"]
    run_until(cores, 0.95)
    n2.tick(1.05)
    n2.outbox()  # its prepare is lost; n1 and n3 answer it for n1's lease
    ballot = n2.leases.owned[slot].ballot
    n2.receive("n1", Refuse(slot, ballot, Ballot(5, 1, "n1"), 0.8, "n1"), 1.06)
    n2.receive("n3", Refuse(slot, ballot, Ballot(5, 1, "n1"), 0.8, "n1"), 1.06)
    assert slot not in n2.leases.owned and n2.leases.retry_at[slot] >= 2.06


def owner_n1_heard_at_n2_until(cores: dict[str, Ownership], slot: int, now: float) -> Ballot:
    """n1 takes `slot` at n2 (a prepare and a write) and renews it there at `now`; n2, next
    in the ring, defers to it until a lease later."""
    n2, ballot = cores["n2"], Ballot(5, 1, "n1")
    run_until(cores, now)
    n2.receive("n1", Prepare(slot, ballot, 1), now)
    n2.receive("n1", Accept(slot, ballot, 1, True, [], []), now)
    n2.receive("n1", Renew(1, 5, [slot], [1], False, 1), now)
    return ballot


def test_the_member_next_in_the_ring_takes_at_once_a_slot_its_owner_resigned():
    """Five-node seed 630166794: the owner's backlog, released by a clog, counted as hearing
    it, and its `Resign` (its lease had run out) came just after; the member next in the ring
    waited a lease from the backlog."""
    cores, slot = two_of_three_without_n1()
    n2 = cores["n2"]
    ballot = owner_n1_heard_at_n2_until(cores, slot, 0.5)
    run_until_from(cores, 0.5, 0.7)
    assert slot not in n2.leases.owned
    n2.receive("n1", Resign(slot, ballot), 0.7)
    assert n2.next_deadline() <= 0.7
    run_until_from(cores, 0.7, 0.8)
    assert n2.acting(slot, 0.8) and n2.owner_of(slot) == "n1"


def test_the_member_next_in_the_ring_waits_out_an_owner_heard_again_after_it_resigned():
    """A `Resign` ends the wait only until the owner is heard again (it asks for the slot or
    renews it): then its silence counts from there, as before."""
    cores, slot = two_of_three_without_n1()
    n2 = cores["n2"]
    ballot = owner_n1_heard_at_n2_until(cores, slot, 0.5)
    n2.receive("n1", Resign(slot, ballot), 0.5)
    n2.receive("n1", Prepare(slot, Ballot(5, 2, "n1"), 1), 0.52)  # its next ballot
    run_until_from(cores, 0.5, 1.5)
    assert slot not in n2.leases.owned
    run_until_from(cores, 1.5, 1.75)
    assert n2.acting(slot, 1.75)


def _taking_slot_0_of_three() -> tuple[Ownership, Ballot]:
    """n1 of three, its ballot for slot 0 promised by n2 and n3 at 0.01: its takeover write (version
    1) is on its way, not accepted yet."""
    core = Ownership(
        "n1", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core.members_changed({"n1": 1, "n2": 1, "n3": 1}, {"n1", "n2", "n3"}, 0.0)
    core._become_ready(5, 0.0, cold=True)
    core.tick(0.0)
    ballot = next(m.ballot for _, m in core.outbox() if isinstance(m, Prepare) and m.slot == 0)
    for member in ("n2", "n3"):
        core.receive(member, Promise(0, ballot, NO_BALLOT, 0, []), 0.01)
    return core, ballot


def test_a_slot_resigned_as_its_takeover_write_commits_is_never_gained():
    """Three-node seed 322074795: a member that took a slot back after a partition healed, and
    resigned it to the member the ring names once the takeover's write committed, was told of
    the slot gained in that step (after it had dropped it): its shard served the slot's peers,
    expired them, and its write of a slot it did not hold crashed the node."""
    core, ballot = _taking_slot_0_of_three()
    core.events()
    core.leave(0.015)  # resigns every slot once its writes are committed
    for member in ("n2", "n3"):
        core.receive(member, Accepted(0, ballot, 1), 0.02)
    assert 0 not in core.leases.owned
    assert not [e for e in core.events() if isinstance(e, Gained) and e.slot == 0]
    assert Resign(0, ballot) in [m for _, m in core.outbox()]


def test_a_resignation_of_a_member_the_ring_does_not_name_starts_no_takeover():
    cores, slot = two_of_three_without_n1()
    n2 = cores["n2"]
    owner_n1_heard_at_n2_until(cores, slot, 0.5)
    other = Ballot(5, 3, "n3")
    n2.receive("n3", Prepare(slot, other, 1), 0.6)
    n2.receive("n3", Accept(slot, other, 2, True, [], []), 0.6)
    n2.receive("n3", Resign(slot, other), 0.6)  # an owner that wrote, but not the named one
    run_until_from(cores, 0.6, 1.5)
    assert slot not in n2.leases.owned


def test_a_life_just_ready_waits_a_lease_before_it_takes_a_slot_over():
    """Its acceptor heard no renewal before it was ready (it answered none), and the owners'
    first renewals come within a quarter lease: it asks for none of their slots meanwhile. (While
    it recovers, its ring leaves it out: it becomes second for its slots when it is ready.)"""
    cores = {}
    for me in ("n2", "n3"):
        core = Ownership(
            me, life=1, lease=1.0, settle=9.0, era_floor=5, rng=random.Random(1), now=0.0
        )
        core.members_changed({"n1": 1, "n2": 1, "n3": 1}, {"n1", "n2", "n3"}, 0.0)
        cores[me] = core
    run_until(cores, 3.0)  # learning the voters: not ready, second for n1's slots
    for core in cores.values():
        core._become_ready(5, 3.0, cold=True)
    _, slot = two_of_three_without_n1()
    run_until_from(cores, 3.0, 3.95)
    assert slot not in cores["n2"].leases.owned
    run_until_from(cores, 3.95, 4.2)
    assert cores["n2"].acting(slot, 4.2)


def test_the_member_next_in_the_ring_takes_nothing_while_its_links_reach_no_quorum():
    cores, slot = two_of_three_without_n1()
    n2 = cores["n2"]
    n2.tick(3.0)  # n3 answered nothing since 0: its own slots' leases ran out
    assert not n2.reaches_quorum(3.0) and slot not in n2.leases.owned
    assert n2.next_deadline() > 3.0


def test_a_preparer_heard_by_fewer_than_a_quorum_waits_a_lease_before_it_asks_again():
    """Its promises lease the slot to it at the acceptors that heard it: they lapse before it
    asks again, and the member next in the ring, which reaches a quorum, finds them free."""
    core, ballot = preparing_slot_3_of_five()
    core.receive("n2", Promise(3, ballot, NO_BALLOT, 0, []), 0.01)  # two of five answered
    core.tick(1.0)
    assert 3 not in core.leases.owned and core.leases.retry_at[3] >= 2.0
    heard, ballot = preparing_slot_3_of_five()
    for member in ("n2", "n3"):  # three of five answered, two refused for another's lease
        heard.receive(member, Refuse(3, ballot, Ballot(5, 1, "n1"), 0.9, "n1"), 0.01)
    heard.tick(1.0)
    assert 3 not in heard.leases.owned and heard.leases.retry_at[3] < 1.5


def five_acting() -> dict[str, Ownership]:
    """Five ready voters, each acting for the slots its ring names it for."""
    members = {f"n{i}": 1 for i in range(1, 6)}
    cores = {}
    for me in members:
        core = Ownership(
            me, life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
        )
        core.members_changed(members, set(members), 0.0)
        core._become_ready(5, 0.0, cold=True)
        cores[me] = core
    run_until(cores, 0.5)
    return cores


def run_with_delays(
    cores: dict[str, Ownership], now: float, end: float, delay: dict[str, float]
) -> None:
    """As `run_until_from`, but a message to or from member m takes `delay[m]` (the larger of
    the two ends') to arrive."""
    due: list[tuple[float, int, str, str, Message]] = []
    sequence = 0
    while now < end:
        now = round(now + 0.01, 6)
        for core in cores.values():
            core.tick(now)
        while True:
            for core in cores.values():
                for to, message in core.outbox():
                    late = max(delay.get(core.me, 0.0), delay.get(to, 0.0))
                    sequence += 1
                    heapq.heappush(due, (round(now + late, 6), sequence, core.me, to, message))
            if not due or due[0][0] > now:
                break
            while due and due[0][0] <= now:
                _, _, sender, to, message = heapq.heappop(due)
                if to in cores:
                    cores[to].receive(sender, message, now)


def test_a_member_whose_rounds_reach_a_quorum_slowly_hands_its_slots_on_until_they_are_fast():
    """Five-node seed 307983845: n2, behind links of 0.55 s each way, was next in the ring after
    a home that crashed, and took its slot 3.5 s later (a refused prepare, a prepare and a
    write), after a client's lease had run out."""
    cores = five_acting()
    n1 = cores["n1"]
    slots_of_n1 = set(n1.placement.mine)
    assert slots_of_n1 and not n1.slow
    run_with_delays(cores, 0.5, 3.0, {"n1": 0.2})  # a quorum round trip of 0.4 s: slow
    assert n1.slow and all(core.placement.slow == {"n1"} for core in cores.values())
    assert not n1.acting_slots(3.0) and "n1" not in n1.placement.ring_owners
    assert all(any(c.acting(slot, 3.0) for c in cores.values()) for slot in slots_of_n1)
    run_with_delays(cores, 3.0, 5.0, {"n1": 0.01})
    assert not n1.slow and all(not core.placement.slow for core in cores.values())
    assert set(n1.acting_slots(5.0)) == slots_of_n1


def test_an_owner_whose_lease_ran_out_resigns_it_and_asks_again_once_a_quorum_is_heard():
    """Five-node seeds 733965563 and 307983834. n1 is cut from the others: its lease runs out,
    its `Resign` ends the lease where it is still heard, and it asks again a lease later, not at
    once (a promise of the minority that heard it would keep the slot from the member next in
    the ring), unless a quorum of voters is heard from first (the next member defers to it)."""
    cores = five_acting()
    n1 = cores.pop("n1")
    slot = next(iter(n1.leases.owned))
    ballot = n1.leases.owned[slot].ballot
    now, resigned = 0.5, []
    while n1.acting(slot, now):
        now = round(now + 0.05, 6)
        n1.tick(now)
        resigned += [m for _, m in n1.outbox() if isinstance(m, Resign) and m.slot == slot]
        exchange(cores, now)
    ran_out = now
    assert resigned == [Resign(slot, ballot)] * 4
    assert n1.leases.retry_at[slot] >= ran_out + 1.0
    n1.receive("n2", Renew(99, 5, [], [], False, 1), ran_out + 0.1)  # two of five: not a quorum
    assert n1.leases.retry_at[slot] >= ran_out + 1.0
    n1.receive("n3", Renew(99, 5, [], [], False, 1), ran_out + 0.2)
    assert n1.leases.retry_at[slot] == ran_out + 0.2
    assert ran_out + 0.2 >= n1.next_deadline()


def test_refused_for_the_lease_of_a_ballot_its_owner_resigned_the_next_member_asks_as_it_ends():
    """A home clogged from a majority and heard through the member next in the ring, S
    (`test_overlapping_faults.py`): the home's lease ran out, its `Resign` reached S alone, and
    S asked at once. The clogged acceptors still leased the slot to the resigned ballot for the
    drift's margin; S, refused for it by a quorum, waited a lease or a half as for a live
    owner, and a heartbeated lease ran out. Those leases end as the refusals say: ask then."""
    cores = five_acting()
    n1 = cores.pop("n1")
    slot = next(s for s in n1.leases.owned if s in cores["n2"].placement.seconded)
    ballot = n1.leases.owned[slot].ballot
    ends = min(cores[m].acceptor.slots[slot].lease_until for m in ("n3", "n4", "n5"))
    resigned_at = round(ends - 0.06, 2)
    n2, now = cores["n2"], 0.5
    while now < resigned_at:  # from 0.5 on, n2 alone hears n1, which renews every quarter lease
        now = round(now + 0.01, 6)
        if round(now / 0.25, 6).is_integer():
            n2.receive("n1", Renew(99, ballot.era, [slot], [ballot.number], False, 1), now)
        exchange(cores, now)
    assert slot not in n2.leases.owned
    n2.receive("n1", Resign(slot, ballot), now)
    exchange(cores, now)
    asking = n2.leases.owned.get(slot)
    assert asking is not None, "n2 stopped asking for a lease and a half"
    assert asking.refused_by_lease == {"n3", "n4", "n5"} and asking.lease_left > 0
    run_until_from(cores, now, now + 0.3)
    assert n2.acting(slot, now + 0.3)


def test_an_acceptor_ends_a_lease_on_a_resign_of_its_ballot_only():
    """A `Resign` that comes late, after the member asked again under a new ballot, or twice,
    ends nothing but the lease it names."""
    cores = five_acting()
    n2 = cores["n2"]
    slot = next(iter(cores["n1"].leases.owned))
    old = cores["n1"].leases.owned[slot].ballot
    newer = Ballot(old.era, old.number + 1, "n1")
    n2.receive("n1", Prepare(slot, newer, 1), 1.0)
    n2.receive("n1", Resign(slot, old), 1.0)
    assert n2.acceptor.slots[slot].lease_until > 1.0
    n2.receive("n1", Resign(slot, newer), 1.0)
    n2.receive("n1", Resign(slot, newer), 1.0)
    assert n2.acceptor.slots[slot].lease_until < 1.0


def test_a_prepare_given_up_ends_its_promises_at_once():
    """Five-node seed 492644394: a member the ring stopped naming left its prepare open, and
    the promises it had kept the slot from the owner named again for another lease."""
    core, ballot = preparing_slot_3_of_five()
    core.outbox()
    core.tick(1.0)  # a whole lease without a quorum of promises
    resigns = [(to, m) for to, m in core.outbox() if isinstance(m, Resign)]
    assert sorted(to for to, _ in resigns) == ["n1", "n2", "n3", "n4"]
    assert {m for _, m in resigns} == {Resign(3, ballot)}
    assert core.acceptor.slots[3].lease_until < 1.0


def test_a_resignation_hands_over_a_slot_its_ballot_wrote_and_nothing_else():
    cores = five_acting()
    n2 = cores["n2"]
    slot = next(iter(n2.leases.owned))
    n2.leases.lose(slot, 0.5, resigned=False)
    n2.leases.retry_at[slot] = 9.0
    asked = Ballot(5, 7, "n3")
    n2.receive("n3", Prepare(slot, asked, 1), 0.6)
    n2.receive("n3", Resign(slot, asked), 0.7)  # a prepare given up
    assert n2.leases.retry_at[slot] == 9.0
    n2.receive("n3", Prepare(slot, asked, 1), 0.75)
    n2.receive("n3", Accept(slot, asked, 1, True, [], []), 0.75)
    n2.receive("n3", Resign(slot, asked), 0.8)  # an owner that wrote
    assert n2.leases.retry_at[slot] == 0.8


def test_a_copy_takes_writes_in_order_and_asks_for_the_whole_slot_after_a_gap():
    copy = SlotCopy()
    ballot = Ballot(1, 1, "n1")
    assert copy.apply(Accept(0, ballot, 1, True, [record(1)], []), 0.0)
    assert copy.apply(Accept(0, ballot, 2, False, [record(2)], [1]), 0.0)
    assert copy.apply(Accept(0, ballot, 2, False, [record(9)], []), 0.0)  # a repeat: no change
    assert {r.key for r in copy.records(0.0)} == {2}
    assert not copy.apply(Accept(0, ballot, 4, False, [record(4)], []), 0.0)  # 3 is missing
    assert (copy.accepted, copy.version) == (ballot, 2)


def test_a_copy_ages_deadlines_and_stretches_them_for_clock_drift():
    copy = SlotCopy()
    copy.apply(Accept(0, Ballot(1, 1, "n1"), 1, True, [record(1)], []), 10.0)
    (aged,) = copy.records(15.0)
    assert aged.expires_in == pytest.approx(60.0 * (1 + 2 * DRIFT) - 5.0)


def test_a_writer_commits_what_a_quorum_holds_and_sends_whole_to_who_fell_behind():
    writer = SlotWriter(0, Ballot(1, 1, "n1"), now=0.0, vote_life=1.0)
    voters = {"n1", "n2", "n3"}
    for _ in range(3):
        writer.next_version(0.0)
    writer.held("n1", 3, 0.0)
    assert writer.committed(voters, 0.0) == 0 and writer.pending(voters, 0.0)
    assert writer.held("n2", 3, 0.0) is False
    assert writer.committed(voters, 0.0) == 3 and not writer.pending(voters, 0.0)
    assert writer.held("n3", 1, 0.0) is False  # behind: the rest is on its way
    assert writer.held("n3", 0, 0.0) is True  # could not apply a write: the slot whole, once
    assert writer.held("n3", 0, 0.0) is False  # (until it holds that whole copy)
    writer.held("n3", 3, 0.0)
    writer.next_version(0.0)
    assert writer.held("n3", 0, 0.0) is True


def test_a_writer_counts_an_acceptors_word_only_for_a_vote_life_after_the_write_was_sent():
    """Its sender may have died since, and its new life recovered without the write: the
    quorum must form while the word is young enough that every other member of it held the
    write before that new life read it (docs/cluster.md, "Which life a vote belongs to")."""
    writer = SlotWriter(0, Ballot(1, 1, "n1"), now=0.0, vote_life=1.0)
    voters = {"n1", "n2", "n3", "n4", "n5"}
    writer.next_version(0.0)
    writer.held("n1", 1, 0.0)
    writer.held("n2", 1, 0.1)  # n2's old life, which then dies
    writer.held("n3", 1, 1.2)  # over a slow link
    assert writer.committed(voters, 1.2) == 0 and writer.pending(voters, 1.2)
    writer.next_version(1.3)  # the owner writes again: words about version 2 count afresh
    writer.held("n1", 2, 1.3)
    writer.held("n3", 2, 1.4)
    assert writer.committed(voters, 1.4) == 0
    writer.held("n4", 2, 1.5)
    assert writer.committed(voters, 1.5) == 2 and not writer.pending(voters, 1.5)
    writer.next_version(1.6)
    writer.held("n1", 3, 1.6)
    writer.held("n3", 3, 1.7)
    writer.held("n4", 3, 2.6)  # exactly a vote life after the send still counts
    assert writer.committed(voters, 2.6) == 3


def test_an_owner_writes_again_once_its_acceptors_words_are_half_spent():
    core, ballot = _taking_slot_0_of_three()
    core.receive("n2", Accepted(0, ballot, 1), 0.02)
    assert core.acting(0, 0.02)
    core.outbox()
    core.write(0, [record(1)], [], 0.1)  # n2 and n3 say nothing of version 2
    core.outbox()
    core.tick(0.1 + core.usable_lease / 2)
    again = [(to, m) for to, m in core.outbox() if isinstance(m, Accept) and m.slot == 0]
    assert again == [(to, Accept(0, ballot, 3, False, [], [])) for to in ("n2", "n3")], (
        "an empty write, as version 3, to every other voter"
    )
    core.receive("n3", Accepted(0, ballot, 3), 0.7)
    assert core.leases.owned[0].writer.committed(core.voters, 0.7) == 3


def test_a_new_life_reads_the_others_only_once_its_quarantine_is_over():
    """Copies sent before then may miss a write that a quorum with its previous life is still
    accepting: the five-node schedule of issue 38 recovered from such copies, and a write the
    client was told of was lost."""
    core = Ownership(
        "n1", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    voters = {"n1", "n2", "n3"}
    core.members_changed({m: 1 for m in voters}, voters, 0.0)
    asked = {to: m.nonce for to, m in core.outbox() if isinstance(m, Recover)}
    assert asked.keys() == {"n2", "n3"}
    for member, nonce in asked.items():
        core.receive(member, RecoverReply(nonce, True, 5, [], 0, 1), 0.01)
    quarantine = 1.0 * (1 + DRIFT) / (1 - DRIFT)
    core.tick(quarantine - 0.01)
    assert not core.ready
    core.tick(quarantine)
    assert not core.ready, "the copies sent during the quarantine do not count"
    again = {to: m.nonce for to, m in core.outbox() if isinstance(m, Recover)}
    assert again.keys() == {"n2", "n3"}
    for member, nonce in again.items():
        core.receive(member, RecoverReply(nonce, True, 5, [], 0, 1), quarantine + 0.01)
    assert core.ready and core.era == 5


def test_a_writer_sends_again_only_to_who_said_nothing_newer_for_a_while():
    writer = SlotWriter(0, Ballot(1, 1, "n1"), now=0.0, vote_life=1.0)
    voters = {"n1", "n2", "n3"}
    writer.next_version(0.0)
    writer.held("n1", 1, 0.0)
    assert writer.stalled(voters, now=0.4, patience=0.5) == []
    assert writer.stalled(voters, now=0.5, patience=0.5) == ["n2", "n3"]
    writer.held("n2", 1, 0.6)
    writer.next_version(0.7)  # n2 was caught up: behind from now on
    writer.next_version(0.8)
    writer.held("n2", 2, 1.1)  # behind, but answering: only slow
    assert writer.stalled(voters, now=1.5, patience=0.5) == ["n1", "n3"]
    assert writer.stalled(voters, now=1.6, patience=0.5) == ["n1", "n2", "n3"]
    writer.sent_whole("n3", 1.6)
    assert writer.stalled(voters, now=2.0, patience=0.5) == ["n1", "n2"]


def test_a_write_lost_on_its_way_goes_again_whole_within_a_lease():
    """Its Accepts lost with a broken link, and no later write to show the acceptors behind:
    without sending it again, what waits on it would wait as long as the owner keeps the slot
    (tests/cluster/test_ownership.py's five-node seed 2 held a resignation back that way)."""
    model = Model(9)
    model.run_until(5.0)
    model._maybe_write = lambda life, now: None  # only the write below
    life = model.lives["n1"]
    now = life.local(model.t)
    slot = life.core.acting_slots(now)[0]
    model.cut |= {("n1", "n2"), ("n1", "n3")}
    life.core.write(slot, [record(10**6)], [], now)
    life.core.gate.hold((slot, 10**6))
    model._after(life, now)
    model.cut.clear()
    assert 10**6 not in model.committed[slot]
    model.run_until(model.t + LEASE)
    assert 10**6 in model.committed[slot]
    assert model.violations == []


def test_the_gate_holds_back_what_follows_uncommitted_writes_and_fails_it_if_they_are_lost():
    gate: CommitGate[str] = CommitGate()
    gate.hold("before anything")
    gate.written(1, 1)
    gate.hold("after slot 1")
    gate.written(2, 1)
    gate.hold("after slot 2")
    assert gate.released() == ["before anything"]
    gate.committed(1, 1)
    assert gate.released() == ["after slot 1"]
    gate.lost(2)
    assert gate.failed() == ["after slot 2"] and gate.released() == []


def test_slots_spread_over_the_members():
    model = Model(9)
    model.run_until(5.0)
    acting = [len(life.core.acting_slots(life.local(model.t))) for life in model.lives.values()]
    assert sum(acting) == SLOTS and min(acting) > SLOTS / 3 * 0.6


def acceptor_of_three() -> tuple[Ownership, int]:
    """n1, ready, as the acceptor of a slot the ring names n3 for."""
    core = Ownership(
        "n1", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core.members_changed({"n1": 1, "n2": 1, "n3": 1}, {"n1", "n2", "n3"}, 0.0)
    core._become_ready(5, 0.0, cold=True)
    slot = next(s for s in range(SLOTS) if core.owner_of(s) == "n3")
    core.outbox()
    return core, slot


def test_requests_go_to_the_live_lessee_a_node_knows_of_else_to_the_ring():
    core, slot = acceptor_of_three()
    core.receive("n2", Prepare(slot, Ballot(5, 9, "n2"), 1), 0.5)  # n2 holds its lease now
    assert core.actor_of(slot, 0.6) == "n2"
    assert core.actor_of(slot, 1.6) == "n3"  # the lease ran out: whom the ring names
    core.members_changed({"n1": 1, "n3": 1}, {"n1", "n2", "n3"}, 0.7)
    assert core.actor_of(slot, 0.8) == core.owner_of(slot), "n2 is counted down"
    # A refusal names the lessee too: a node that was away learns where the slot lives.
    other = next(s for s in range(SLOTS) if s != slot)
    core.receive("n3", Refuse(other, Ballot(5, 1, "n1"), Ballot(5, 1, "n1"), 0.5, "n3"), 0.9)
    assert core.actor_of(other, 1.0) == "n3"


def test_a_node_does_not_serve_for_a_lease_its_own_acceptor_promised_it_in_vain():
    core = Ownership(
        "n3", life=1, lease=1.0, settle=0.0, era_floor=5, rng=random.Random(1), now=0.0
    )
    core.members_changed({"n1": 1, "n2": 1, "n3": 1}, {"n1", "n2", "n3"}, 0.0)
    core._become_ready(5, 0.0, cold=True)
    slot = next(s for s in range(SLOTS) if core.owner_of(s) == "n3" and not core.acting(s, 0.0))
    core.outbox()
    # n3 asked for the slot and promised itself; n2 refused, for n1's lease.
    core.receive("n3", Prepare(slot, Ballot(5, 4, "n3"), 1), 0.5)
    assert not core.acting(slot, 0.6)
    assert core.actor_of(slot, 0.6) == "n3", "nobody else named yet: the ring"
    core.receive("n2", Refuse(slot, Ballot(5, 4, "n3"), Ballot(5, 1, "n1"), 0.8, "n1"), 0.6)
    assert core.actor_of(slot, 0.7) == "n1"
    # n1 wins a larger ballot and writes: the writer, while n3's own promise runs.
    other = next(s for s in range(SLOTS) if s != slot and core.owner_of(s) == "n3")
    core.receive("n3", Prepare(other, Ballot(5, 4, "n3"), 1), 0.5)
    core.receive("n1", Accept(other, Ballot(5, 5, "n1"), 1, True, [record(5)], []), 0.6)
    assert core.actor_of(other, 0.7) == "n1"
    assert core.actor_of(other, 1.7) == "n3", "the promise ran out: the ring"


def test_a_cluster_grows_from_one_member_one_at_a_time():
    model = Model(10, start=["n1"])
    model.run_until(4.0)
    n1 = model.lives["n1"]
    assert n1.core.ready and len(n1.core.acting_slots(n1.local(model.t))) == SLOTS
    model.start("n2")
    model.run_until(9.0)
    model.start("n3")
    model.run_until(15.0)
    assert all(life.core.ready for life in model.lives.values())
    assert len({life.core.era for life in model.lives.values()}) == 1, "joined, not cold"
    acting = [len(life.core.acting_slots(life.local(model.t))) for life in model.lives.values()]
    assert sum(acting) == SLOTS and min(acting) > 0
    assert model.violations == []


def test_a_copy_keeps_locks_as_values_the_garbage_collector_does_not_walk():
    """Every acceptor keeps every lock of the cluster: as objects, 20,000 waiting locks were
    40,000 more objects for each full collection to walk, and a semaphore kept as an object
    beside them kept the whole table walked (20,000 references). A copy gives back what it
    took."""
    copy = SlotCopy()
    objects, references = held(copy)
    write = [LockRecord("B", peer_id, 1, 1, 0, True, peer_id) for peer_id in range(2000)]
    write.append(SemaphoreRecord("B", 7, 2000))
    copy.apply(Accept(0, Ballot(1, 1, "n1"), 1, True, write, []), 0.0)
    del write
    more_objects, more_references = held(copy)
    assert more_objects - objects < 50 and more_references - references < 500
    assert {r.key: r for r in copy.records(1.0)} == {
        lock_key("B", peer_id): LockRecord("B", peer_id, 1, 1, 0, True, peer_id)
        for peer_id in range(2000)
    } | {"s:B": SemaphoreRecord("B", 7, 2000)}


def answer_to(core: Ownership, sender: str, message: object, now: float) -> object:
    core.receive(sender, message, now)
    (answer,) = [m for to, m in core.outbox() if to == sender]
    return answer


def test_a_new_life_asking_to_recover_ends_the_leases_of_the_lives_before_it():
    """Five-node seed 811107053: n5 took a slot and crashed at once; its next life came back
    0.1 s later, and its dead life's lease kept n2 out for two seconds more."""
    core, slot = acceptor_of_three()
    assert isinstance(answer_to(core, "n2", Prepare(slot, Ballot(5, 1, "n2"), 7), 0.1), Promise)
    refused = answer_to(core, "n3", Prepare(slot, Ballot(5, 2, "n3"), 1), 0.2)
    assert isinstance(refused, Refuse) and refused.lessee == "n2"
    core.receive("n2", Recover(99, 8), 0.3)  # n2's next life
    core.outbox()
    assert isinstance(answer_to(core, "n3", Prepare(slot, Ballot(5, 3, "n3"), 1), 0.4), Promise)
    # What the dead life said late is refused: it leases nothing again.
    late = answer_to(core, "n2", Renew(4, 5, [slot], [1], False, 7), 0.5)
    assert late.refused == [slot] and late.renewed == []
    assert isinstance(answer_to(core, "n2", Prepare(slot, Ballot(5, 9, "n2"), 7), 0.5), Refuse)


def test_a_repeated_or_older_recover_ends_no_lease_of_the_life_that_holds_it():
    """A `Recover` of the lessee's own life, or of one before it, said again and arriving after
    the life was ready and leased the slot: that life is alive, and its lease stands."""
    core, slot = acceptor_of_three()
    core.receive("n2", Recover(98, 8), 0.1)
    core.outbox()
    assert isinstance(answer_to(core, "n2", Prepare(slot, Ballot(5, 1, "n2"), 8), 0.2), Promise)
    core.receive("n2", Recover(98, 8), 0.3)
    core.receive("n2", Recover(97, 7), 0.3)
    core.outbox()
    refused = answer_to(core, "n3", Prepare(slot, Ballot(5, 2, "n3"), 1), 0.4)
    assert isinstance(refused, Refuse) and refused.lessee == "n2"
    assert answer_to(core, "n2", Renew(4, 5, [slot], [1], False, 8), 0.5).renewed == [slot]
