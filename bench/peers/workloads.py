"""What the workers of bench/cluster_vs_peers.py do, and what a run of them records; shared by
the three systems' drivers (etcd.py, zookeeper.py, sluicegate.py beside this file)."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

# The most one acquire and release may take before the worker counts it as an error.
CYCLE_LIMIT = 30.0
# After an error, so that a worker whose calls fail at once does not spin.
ERROR_PAUSE = 0.05
SEMAPHORE_MAX = 8


@dataclass(frozen=True)
class Workload:
    name: str
    workers: int
    # All workers share one counting semaphore of SEMAPHORE_MAX; otherwise each its own mutex.
    shared_semaphore: bool


SEQUENTIAL = Workload("sequential, 1 worker", 1, False)
OWN_LOCKS = Workload("32 workers, own lock each", 32, False)
SHARED_SEMAPHORE = Workload(f"semaphore of {SEMAPHORE_MAX}, 32 workers", 32, True)
WORKLOADS = (SEQUENTIAL, OWN_LOCKS, SHARED_SEMAPHORE)


@dataclass
class Run:
    """The cycles (acquire and release) and the errors of one run of workers, on
    `time.monotonic`'s clock. Workers append from their own threads or tasks."""

    started: float = 0.0
    ended: float = 0.0
    # When the member serving the lock was killed, in a failover run.
    killed_at: float | None = None
    cycles: list[tuple[float, float]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    # Set once the clients are connected and the workers start: a failover's kill waits for it.
    began: threading.Event = field(default_factory=threading.Event)

    def begin(self) -> None:
        self.started = time.monotonic()
        self.began.set()

    def finish(self) -> None:
        self.ended = time.monotonic()

    def completed(self, started: float, ended: float) -> None:
        self.cycles.append((started, ended))

    def failed(self, error: BaseException) -> None:
        self.errors[f"{type(error).__name__}: {str(error)[:80]}".rstrip(": ")] += 1

    @property
    def last_end(self) -> float:
        return self.cycles[-1][1] if self.cycles else 0.0

    def rate(self) -> float:
        return len(self.cycles) / max(self.ended - self.started, 1e-9)

    def p50(self) -> float:
        return statistics.median(end - start for start, end in self.cycles)

    def longest_gap(self) -> float:
        """The longest time without a completed cycle, from the start to the end of the run."""
        ends = [self.started, *sorted(end for _, end in self.cycles), self.ended]
        return max(later - earlier for earlier, later in zip(ends, ends[1:], strict=False))


Until = Callable[[Run], bool]


def for_seconds(duration: float) -> Until:
    return lambda run: time.monotonic() >= run.started + duration


def recovered(after: float, limit: float) -> Until:
    """Done once a cycle has completed since the kill and `after` seconds have passed since it,
    or `limit` seconds after it whatever happened."""

    def done(run: Run) -> bool:
        if run.killed_at is None:
            return False
        since_kill = time.monotonic() - run.killed_at
        return since_kill >= limit or (since_kill >= after and run.last_end > run.killed_at)

    return done


async def run_async_workers(
    cycles: Sequence[Callable[[], Awaitable[object]]], run: Run, until: Until, within: float
) -> None:
    """One task per cycle function, each repeating it until `until(run)`; under asyncio or trio.
    Workers still going after `within` seconds are cancelled and counted as errors."""
    run.begin()
    with anyio.move_on_after(within) as scope:
        async with anyio.create_task_group() as group:
            for cycle in cycles:
                group.start_soon(_async_worker, cycle, run, until)
    if scope.cancelled_caught:
        run.errors[f"a worker still busy after {within:g} s, cancelled"] += 1
    run.finish()


async def _async_worker(cycle: Callable[[], Awaitable[object]], run: Run, until: Until) -> None:
    while not until(run):
        started = time.monotonic()
        try:
            with anyio.fail_after(CYCLE_LIMIT):
                await cycle()
        except Exception as error:
            run.failed(error)
            await anyio.sleep(ERROR_PAUSE)
        else:
            run.completed(started, time.monotonic())


def run_thread_workers(
    cycles: Sequence[Callable[[], object]], run: Run, until: Until, within: float
) -> None:
    """One thread per cycle function, each repeating it until `until(run)`. A thread still
    going after `within` seconds is left behind (a daemon) and counted as an error."""
    threads = [
        threading.Thread(target=_thread_worker, args=(cycle, run, until), daemon=True)
        for cycle in cycles
    ]
    run.begin()
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + within
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
    stuck = sum(thread.is_alive() for thread in threads)
    if stuck:
        run.errors[f"{stuck} worker(s) still busy after {within:g} s, left behind"] += 1
    run.finish()


def _thread_worker(cycle: Callable[[], object], run: Run, until: Until) -> None:
    while not until(run):
        started = time.monotonic()
        try:
            cycle()
        except Exception as error:
            run.failed(error)
            time.sleep(ERROR_PAUSE)
        else:
            run.completed(started, time.monotonic())
