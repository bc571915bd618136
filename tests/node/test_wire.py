"""The node-link codec: round trips, strict checking, and no crash on any input."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.cluster.departures import Claim
from sluicegate.cluster.membership import Gossip, MemberState
from sluicegate.cluster.semaphore_ops import Acquire, Heartbeat, IsAcquired, Remainder, Restore
from sluicegate.node.wire import MAX_FRAME, Codec, WireError

CODEC = Codec(
    {
        1: Gossip,
        2: MemberState,
        3: Acquire,
        4: Restore,
        5: IsAcquired,
        6: Heartbeat,
        7: Remainder,
        8: Claim,
    }
)

u64 = st.integers(0, 2**64 - 1)
names = st.text(max_size=20)
seconds = st.floats(0, 1e9, allow_nan=False)
claim = st.builds(Claim, names, st.integers(0, 2**40), st.binary(min_size=32, max_size=32))
member = st.builds(
    MemberState,
    names,
    names,
    st.integers(0, 2**40),
    st.integers(0, 2**40),
    st.booleans(),
    names,
    st.lists(claim, max_size=3).map(tuple),
)
message = st.one_of(
    st.builds(Gossip, names, st.lists(member, max_size=5).map(tuple)),
    st.builds(
        Acquire,
        u64,
        names,
        st.integers(-(2**63), 2**63 - 1),
        st.none() | seconds,
        st.none() | seconds,
    ),
    st.builds(Restore, u64, seconds, st.dictionaries(names, st.integers(1, 1000), max_size=4)),
    st.builds(IsAcquired, u64),
    st.builds(Heartbeat, u64, seconds),
    st.builds(Remainder, names),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(message, max_size=8))
def test_messages_round_trip(messages):
    assert CODEC.decode(CODEC.encode(messages)) == messages


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_rejected_cleanly(data):
    try:
        CODEC.decode(data)
    except WireError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=12,
    )
)
def test_arbitrary_msgpack_values_are_rejected_cleanly(value):
    try:
        CODEC.decode(msgpack.packb(value))
    except WireError:
        pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (5, "a frame is an array of messages"),
        ([[99]], "unknown message tag 99"),
        ([["x"]], "expected [tag, fields...]"),
        ([[3, 1, "A"]], "Acquire takes 6 fields, got 2"),
        ([[3, "x", "A", 1, None, None, None]], "Acquire.peer_id: expected int, got str"),
        ([[3, True, "A", 1, None, None, None]], "Acquire.peer_id: expected int, got bool"),
        ([[4, 1, 60.0, {"A": "x"}, None]], "Restore.acquired[]: expected int, got str"),
        (
            [[1, "n1", [[2, "n1", "a", 1, "2", False, "", []]]]],
            "MemberState.heartbeat: expected int",
        ),
        ([[1, "n1", [[3, 1, "A", 1, None, None, False]]]], "expected MemberState, got Acquire"),
        ([[1, "n1", [[2, "n1", "a", 1]]]], "MemberState takes 7 fields, got 3"),
    ],
)
def test_malformed_messages_say_what_is_wrong(value, message):
    with pytest.raises(WireError, match=None) as error:
        CODEC.decode(msgpack.packb(value))
    assert message in str(error.value)


def test_oversized_frames_are_refused_both_ways():
    with pytest.raises(WireError):
        CODEC.encode([Remainder("A")] * (MAX_FRAME // 4))
    with pytest.raises(WireError):
        CODEC.decode(b"\x90" * (MAX_FRAME + 1))


def test_unregistered_messages_cannot_be_sent():
    with pytest.raises(TypeError):
        CODEC.encode([object()])


def test_integer_seconds_decode_as_floats():
    [decoded] = CODEC.decode(msgpack.packb([[6, 1, 30]]))
    assert decoded == Heartbeat(1, 30.0)
    assert isinstance(decoded.expires_in, float)
