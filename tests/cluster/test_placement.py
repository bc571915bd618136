"""The ring as one node sees it: who is named for each slot, and who is next."""

from sluicegate.cluster.placement import Placement
from sluicegate.cluster.ring import Ring
from sluicegate.cluster.slots import slot_owners, slot_successors

VOTERS = {"n1", "n2", "n3"}


def seen_by_n2(live: dict[str, int]) -> tuple[Placement, list[int], list[int]]:
    placement = Placement("n2")
    placement.members_changed(live, VOTERS, ready=False)  # lives known before it was ready
    return placement, *placement.designate(ready=True)


def slots_of(owner: str, then: str, members: set[str]) -> set[int]:
    ring = Ring(members)
    pairs = enumerate(zip(slot_owners(ring), slot_successors(ring), strict=True))
    return {slot for slot, named in pairs if named == (owner, then)}


def a_slot_of_n1_then_n2() -> int:
    return min(slots_of("n1", "n2", VOTERS))


def test_named_next_after_the_same_life_again_a_member_is_not_newly_second():
    """n2's view counts n1 down (n2 is named) and up again: n2 deferred to that life of n1
    already, and its silence counts from before (five-node seed 733564309: the flap made n5
    wait a lease more, and a client's lease ran out)."""
    slot = a_slot_of_n1_then_n2()
    placement, _, newly_seconded = seen_by_n2({"n1": 1, "n2": 1, "n3": 1})
    assert slot in newly_seconded
    placement.members_changed({"n2": 1, "n3": 1}, VOTERS, ready=True)
    newly_mine, _ = placement.designate(ready=True)
    assert slot in newly_mine
    placement.members_changed({"n1": 1, "n2": 1, "n3": 1}, VOTERS, ready=True)
    _, newly_seconded = placement.designate(ready=True)
    assert slot in placement.seconded and slot not in newly_seconded


def test_named_next_after_a_new_life_of_the_owner_a_member_is_newly_second():
    slot = a_slot_of_n1_then_n2()
    placement, _, _ = seen_by_n2({"n1": 1, "n2": 1, "n3": 1})
    placement.members_changed({"n1": 2, "n2": 1, "n3": 1}, VOTERS, ready=True)
    placement.designate(ready=True)  # the new life recovers: left out of the ring
    assert placement.ring_owners[slot] == "n2"
    placement.heard("n1", recovering=False)
    _, newly_seconded = placement.designate(ready=True)
    assert slot in newly_seconded


def test_named_next_after_the_owner_again_once_another_owned_the_slot_a_member_is_newly_second():
    """n4 joined and was named for the slot, then left: n1 named again may have resigned the
    slot to n4, and asks for it anew, so n2 defers to it again."""
    placement, _, _ = seen_by_n2({"n1": 1, "n2": 1, "n3": 1})
    with_n4 = {"n1": 1, "n2": 1, "n3": 1, "n4": 1}
    of_n4 = {slot for slot, owner in enumerate(slot_owners(Ring(set(with_n4)))) if owner == "n4"}
    joined = min(slots_of("n1", "n2", VOTERS) & of_n4)
    placement.members_changed(with_n4, VOTERS | {"n4"}, ready=True)
    placement.heard("n4", recovering=False)  # ready
    placement.designate(ready=True)
    assert placement.ring_owners[joined] == "n4"
    placement.members_changed({"n1": 1, "n2": 1, "n3": 1}, VOTERS, ready=True)
    _, newly_seconded = placement.designate(ready=True)
    assert joined in newly_seconded


def test_the_ring_leaves_out_slow_members_while_others_remain():
    placement, _, _ = seen_by_n2({"n1": 1, "n2": 1, "n3": 1})
    assert placement.paced("n1", True) and not placement.paced("n1", True)
    placement.designate(ready=True)
    assert "n1" not in placement.ring_owners and placement.ring_owners.count("n2") > 0
    placement.paced("n2", True)
    placement.paced("n3", True)
    placement.designate(ready=True)  # all slow: named all the same
    assert set(placement.ring_owners) == {"n1", "n2", "n3"}


def test_a_new_life_of_a_slow_member_is_not_slow_until_it_says_so():
    placement, _, _ = seen_by_n2({"n1": 1, "n2": 1, "n3": 1})
    placement.paced("n1", True)
    placement.paced("n2", True)
    placement.members_changed({"n1": 1, "n2": 1, "n3": 1}, VOTERS, ready=True)
    assert placement.slow == {"n1", "n2"}
    placement.members_changed({"n1": 2, "n2": 1, "n3": 1}, VOTERS, ready=True)
    assert placement.slow == {"n2"}
