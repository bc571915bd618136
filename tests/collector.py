"""What a full garbage collection walks: the measure of the tests that keep the node's
tables of waiting acquires, peers and locks as plain values."""

from __future__ import annotations

import gc


def walked() -> tuple[int, int]:
    """Tracked objects after full collections, and the references from them."""
    for _ in range(3):
        gc.collect()
    tracked = gc.get_objects()
    return len(tracked), sum(len(gc.get_referents(o)) for o in tracked)
