"""Throttle's Prometheus families, rendered as Throttle renders them.

Throttle's Rust registry prints integer gauges without a decimal point (`... 0`, where Python's
prometheus-client would print `0.0`), sorts families by name and samples by label value, and prints
nothing for a family without samples. Stock dashboards and alerts parse this text, so it is written
here by hand; sluicegate's own `sluicegate_*` metrics go beside it from prometheus-client.
"""

from __future__ import annotations

import math

from sluicegate.cluster.semaphores import SemaphoreStats

_FAMILIES = (
    ("throttle_acquired", "Sum of all acquired locks.", lambda s: s.acquired),
    (
        "throttle_longest_pending_sec",
        "Time the longest pending peer is waiting until now, to acquire a lock to a semaphore.",
        lambda s: math.floor(s.longest_pending),
    ),
    ("throttle_max", "Maximum allowed lock count for this semaphore.", lambda s: s.max),
    ("throttle_pending", "Sum of all pending locks", lambda s: s.pending),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(stats: list[SemaphoreStats]) -> str:
    if not stats:
        return ""
    ordered = sorted(stats, key=lambda s: s.name)
    lines = []
    for name, help_text, value_of in _FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for s in ordered:
            lines.append(f'{name}{{semaphore="{_label(s.name)}"}} {value_of(s)}')
    return "\n".join(lines) + "\n"
