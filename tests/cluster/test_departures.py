"""Departed members (`cluster/departures.py`): what a node's writes settle, when a departure
is settled everywhere, and how many others a new life reads meanwhile."""

from __future__ import annotations

import pytest

from sluicegate.cluster.departures import (
    EVERY_SLOT,
    SLOT_BYTES,
    Claim,
    Settling,
    reads_needed,
    unsettled,
)
from sluicegate.cluster.membership import Gossip, Membership, MemberState

F = ("f", 7)


def bits(marked: int) -> bytes:
    return marked.to_bytes(SLOT_BYTES, "little")


def test_only_a_version_first_sent_after_the_departure_settles_its_slot():
    settling = Settling()
    settling.departures({F}, set(), now=10.0)
    settling.committed(3, first_sent=9.5)  # its quorum may have counted F
    assert settling.unmarked(3)
    settling.committed(3, first_sent=10.0)
    assert not settling.unmarked(3) and settling.unmarked(4)
    assert settling.claims() == (Claim("f", 7, bits(1 << 3)),)


def test_a_departure_settled_everywhere_is_claimed_whole_and_one_that_came_back_is_dropped():
    settling = Settling()
    settling.departures({F}, {F}, now=1.0)
    assert settling.claims() == (Claim("f", 7, bits(EVERY_SLOT)),)
    settling.departures(set(), set(), now=2.0)  # F is a member again
    assert settling.claims() == ()


def test_a_departure_is_settled_once_the_claims_together_cover_every_slot():
    half = (1 << 128) - 1
    assert unsettled({F}, [Claim("f", 7, bits(half))]) == {F}
    assert (
        unsettled({F}, [Claim("f", 7, bits(half)), Claim("f", 7, bits(EVERY_SLOT ^ half))]) == set()
    )
    assert unsettled({F}, [Claim("f", 6, bits(EVERY_SLOT))]) == {F}  # another life of f


@pytest.mark.parametrize(
    ("voters", "departed", "reads"),
    [
        (4, 0, 2),  # n − q + 1 of four
        (4, 1, 3),  # as of five: all three others
        (6, 1, 4),  # as of seven
        (3, 2, 2),  # as of five would be three of two others: as of four
        (2, 1, 1),  # as of three would be two of one other: F and the crash were a majority
        (1, 0, 1),
    ],
)
def test_a_new_life_reads_as_many_others_as_the_voters_and_the_departed_need(
    voters, departed, reads
):
    assert reads_needed(voters, departed) == reads


def test_members_gossip_their_claims_and_learn_which_departures_are_settled():
    a = Membership("a", "a:1", 1)
    gossip = Gossip(
        "b",
        (
            MemberState("b", "b:1", 1, 5, settled=(Claim("f", 7, bits(EVERY_SLOT ^ 1)),)),
            MemberState("f", "f:1", 7, 9, left=True),
        ),
    )
    a.receive(gossip, now=0.0)
    assert a.departures() == ({F}, {F})
    a.claim((Claim("f", 7, bits(1)),))  # a settled slot 0
    assert a.departures() == ({F}, set())
    assert a.gossip().members[0].settled == (Claim("f", 7, bits(1)),)
