"""A run stuck without virtual time passing ends as a livelock (simulations/run.py), judged by
the CPU time it used, not the wall clock's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# In a process of its own: a run sets trio's scheduling to be deterministic for the process, and
# a livelock ends it wherever it was, trio's own code included.
SPIN = """
import time
import trio
from simulations import run

async def spin(*args):
    while True:
        await trio.sleep(0)

run._simulate = spin
run.LIVELOCK_AFTER = 0.5
started = time.process_time()
outcome = run.run_seed(0)
print(time.process_time() - started, outcome.violations[0])
"""


def test_a_run_that_spins_without_virtual_time_passing_is_a_livelock_by_its_cpu_time():
    """CPU seconds, so that a run starved by a busy machine is not taken for one: the sweep of
    `make test` died so beside a long sweep at a higher priority."""
    done = subprocess.run(
        [sys.executable, "-c", SPIN],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    used_the_cpu, violation = done.stdout.split(" ", 1)
    # The kernel counts a CPU timer in scheduler ticks: it may fire a tick before the process's
    # own count reaches the mark. A wall-clock timer on a busy machine fires far earlier.
    assert float(used_the_cpu) >= 0.45, (used_the_cpu, done.stderr[-2000:])
    assert "[liveness]" in violation and "livelock" in violation
