"""What a full garbage collection walks: the measure of the tests that keep the node's
tables of waiting acquires, peers and locks as plain values."""

from __future__ import annotations

import gc
import types

# Shared by every instance: a collection walks them whatever the structure holds.
_SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
# The test session, reached through the test's own coroutine and its fixtures: it grows with
# the session (reports, captured log records of other tests' leftover threads).
_SESSION = ("_pytest", "pytest", "pluggy")


def held(root: object) -> tuple[int, int]:
    """Tracked objects reachable from `root` after full collections, and the references from
    them: what one structure adds to every full collection, whatever else the process holds."""
    _collect()
    seen: set[int] = set()
    stack = [root]
    references = 0
    while stack:
        obj = stack.pop()
        if (
            id(obj) in seen
            or isinstance(obj, _SHARED)
            or not gc.is_tracked(obj)
            or type(obj).__module__.startswith(_SESSION)
        ):
            continue
        seen.add(id(obj))
        referents = gc.get_referents(obj)
        references += len(referents)
        stack.extend(referents)
    return len(seen), references


def _collect() -> None:
    for _ in range(3):
        gc.collect()
