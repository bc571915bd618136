"""Whether a node's lease rounds reach a quorum too slowly for it to act for slots."""

from sluicegate.cluster.pace import Pace

LEASE = 2.0  # slow over 0.5 s, fast again under 0.25 s


def rounds(pace: Pace, took: float, start: float, count: int, every: float = 0.5) -> list[bool]:
    return [pace.round_trip(start + i * every, start + i * every + took) for i in range(count)]


def test_two_slow_rounds_in_a_row_make_a_node_slow_and_two_fast_ones_fast_again():
    pace = Pace(LEASE)
    assert rounds(pace, 0.6, 0.0, 1) == [False] and not pace.slow
    assert rounds(pace, 0.01, 0.5, 1) == [False]  # the run is broken
    assert rounds(pace, 0.6, 1.0, 2) == [False, True] and pace.slow
    assert rounds(pace, 0.3, 2.0, 3) == [False] * 3 and pace.slow  # between the thresholds
    assert rounds(pace, 0.1, 3.5, 2) == [False, True] and not pace.slow


def test_a_backlog_of_rounds_answered_at_once_is_not_a_slow_path():
    """A clog released, or a pause ended: every round sent meanwhile reaches a quorum in one
    burst, each late, and the node is no slower than before."""
    pace = Pace(LEASE)
    released = 10.0
    for sent in (8.0, 8.5, 9.0, 9.5):
        assert not pace.round_trip(sent, released)
    assert not pace.slow
    assert rounds(pace, 0.01, 10.0, 4) == [False] * 4 and not pace.slow
