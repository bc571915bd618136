"""The consistent-hash ring: stable placement, pinned distribution, minimal movement."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.cluster.ring import Ring, peer_key, semaphore_key, stable_hash


def test_hash_is_stable_across_processes_and_versions():
    # Pinned: every node of every version must place keys identically.
    assert stable_hash(b"sluicegate") == 13693038256993911501


def test_exact_distribution_is_pinned():
    ring = Ring(["n1", "n2", "n3"])
    semaphores = collections.Counter(ring.owner(semaphore_key(f"sem-{i}")) for i in range(30000))
    peers = collections.Counter(ring.owner(peer_key(i * 7919)) for i in range(30000))
    assert semaphores == {"n1": 10249, "n2": 9840, "n3": 9911}
    assert peers == {"n1": 10370, "n2": 9835, "n3": 9795}
    assert ring.preference_list(semaphore_key("A"), 3) == ["n3", "n1", "n2"]


def test_empty_ring_owns_nothing():
    ring = Ring([])
    assert ring.owner(b"x") is None
    assert ring.preference_list(b"x", 3) == []


def test_member_order_does_not_matter():
    a = Ring(["n1", "n2", "n3"])
    b = Ring(["n3", "n1", "n2"])
    assert a == b
    assert all(a.owner(b"k%d" % i) == b.owner(b"k%d" % i) for i in range(1000))


def test_preference_list_is_distinct_and_starts_with_the_owner():
    ring = Ring(["n1", "n2", "n3", "n4"])
    for i in range(500):
        key = semaphore_key(f"s{i}")
        prefs = ring.preference_list(key, 3)
        assert prefs[0] == ring.owner(key)
        assert len(prefs) == len(set(prefs)) == 3
    assert len(ring.preference_list(b"k", 10)) == 4


def test_vnodes_must_be_positive():
    with pytest.raises(ValueError):
        Ring(["n1"], vnodes=0)


members = st.lists(
    st.text(alphabet="abcdefgh0123456789", min_size=1, max_size=6),
    min_size=1,
    max_size=6,
    unique=True,
)
KEYS = [semaphore_key(f"key-{i}") for i in range(2000)]


@settings(max_examples=60, deadline=None)
@given(members=members, newcomer=st.text(alphabet="xyz", min_size=1, max_size=4))
def test_adding_a_member_only_moves_keys_to_it(members, newcomer):
    before = Ring(members)
    after = Ring([*members, newcomer])
    for key in KEYS:
        old, new = before.owner(key), after.owner(key)
        assert new == old or new == newcomer


@settings(max_examples=60, deadline=None)
@given(members=members.filter(lambda m: len(m) >= 2), data=st.data())
def test_removing_a_member_only_moves_its_keys(members, data):
    gone = data.draw(st.sampled_from(members))
    before = Ring(members)
    after = Ring([m for m in members if m != gone])
    for key in KEYS:
        if before.owner(key) != gone:
            assert after.owner(key) == before.owner(key)
        else:
            # The keys of a departed member go to its first successor: where the replica lives.
            assert after.owner(key) == before.preference_list(key, 2)[1]


@settings(max_examples=20, deadline=None)
@given(count=st.integers(min_value=2, max_value=7))
def test_load_is_balanced_within_a_quarter(count):
    ring = Ring([f"node-{i}" for i in range(count)])
    owners = collections.Counter(ring.owner(key) for key in KEYS)
    fair = len(KEYS) / count
    assert set(owners) == set(ring.members)
    assert max(abs(n - fair) / fair for n in owners.values()) < 0.25
