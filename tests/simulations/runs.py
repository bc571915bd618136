"""The simulation runs that tests/simulations judge, run in the background from the moment the
session's tests are collected, two at a time at the lowest CPU priority.

A test module declares each run it judges as a fixture (`background`, `background_group`), and
a test asks for the run by naming that fixture; a run no collected test names does not start.
The rest of `make test` keeps about one core busy and waits on node processes much of the time;
these runs take what it leaves, and the tests that read them come last, so the suite lasts
about as long as the longer of the two rather than their sum. At nice 19 they get almost
nothing while a test needs both cores. A run is deterministic (a virtual clock and its seed), so
the load around it changes nothing in it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIMULATIONS = ROOT / "simulations"
# The longest one run may take, and a test may wait for the runs before its own.
RUN_TIMEOUT = 1800.0
WAIT_TIMEOUT = 3600.0
# Runs under way at once.
LANES = 2


@dataclass(frozen=True)
class Run:
    """`python -m simulations COMMAND ARGS` under PYTHONHASHSEED=`hash_seed`; for `run`, with
    `--seeds-from` a file listing `seeds` (if given), in `jobs` processes."""

    args: tuple[str, ...]
    seeds: tuple[int, ...] = ()
    jobs: int = 1
    hash_seed: int = 0
    command: str = "run"


def _command(args: Iterable[str], command: str = "run") -> list[str]:
    return [sys.executable, "-m", "simulations", command, *args]


def _env(hash_seed: int) -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": str(hash_seed)}


class BackgroundRuns:
    """Declared runs, started in `LANES` threads of their own; `result` waits for one."""

    def __init__(self) -> None:
        self.declared: dict[str, Run] = {}
        self._done: dict[str, threading.Event] = {}
        self._results: dict[str, subprocess.CompletedProcess | BaseException] = {}
        self._lock = threading.Lock()
        self._queue: list[str] = []
        self._running: set[subprocess.Popen] = set()
        self._stopped = False

    def declare(self, name: str, run: Run) -> None:
        self.declared[name] = run

    def named(self, fixture_names: set[str]) -> list[str]:
        """The runs that tests with these fixtures wait for (a group's: all of its own)."""
        return [
            name
            for name in self.declared
            if name in fixture_names or name.split(":", 1)[0] in fixture_names
        ]

    def start(self, names: Iterable[str]) -> None:
        """Queue `names`: runs of many seeds first, which leaves the short ones to fill in."""
        fresh = sorted(
            (name for name in names if name not in self._done),
            key=lambda name: -self.declared[name].jobs,
        )
        for name in fresh:
            self._done[name] = threading.Event()
        with self._lock:
            self._queue.extend(fresh)
        for _ in range(min(LANES, len(fresh))):
            threading.Thread(target=self._lane, daemon=True).start()

    def _lane(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                name = self._queue.pop(0)
            try:
                self._results[name] = self._run(self.declared[name])
            except BaseException as error:  # the test that waits for it says so
                self._results[name] = error
            self._done[name].set()

    def _run(self, run: Run) -> subprocess.CompletedProcess:
        args = [*run.args, *(("--jobs", str(run.jobs)) if run.command == "run" else ())]
        listed = None
        if run.seeds:
            listed = tempfile.NamedTemporaryFile("w", prefix="sluicegate-seeds-", delete=False)
            with listed:
                listed.write("".join(f"{seed}\n" for seed in run.seeds))
            args += ["--seeds-from", listed.name]
        # nice(1), not os.nice in preexec_fn, which is unsafe beside other threads.
        command = ["nice", "-n", "19", *_command(args, run.command)]
        try:
            with self._lock:
                if self._stopped:
                    raise RuntimeError("the session ended before this run started")
                # A process group of its own: a kill takes the sweep's worker processes with
                # it, which a killed sweep would leave behind. Not a session: Linux schedules
                # each session as a group (autogroup) with the same share as the test's own,
                # whatever the nice value of its processes.
                process = subprocess.Popen(
                    command,
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=_env(run.hash_seed),
                    process_group=0,
                )
                self._running.add(process)
            try:
                stdout, stderr = process.communicate(timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                process.communicate()
                raise
            finally:
                with self._lock:
                    self._running.discard(process)
        finally:
            if listed is not None:
                os.unlink(listed.name)
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def result(self, name: str) -> subprocess.CompletedProcess:
        """The finished run `name`, started now if nothing started it."""
        if name not in self._done:
            self.start([name])
        if not self._done[name].wait(WAIT_TIMEOUT):
            raise TimeoutError(f"the simulation run {name!r} did not end in {WAIT_TIMEOUT:g} s")
        result = self._results[name]
        if isinstance(result, BaseException):
            raise result
        return result

    def stop(self) -> None:
        """End the runs under way, and start no more (the session is over)."""
        with self._lock:
            self._stopped = True
            self._queue.clear()
            for process in self._running:
                if process.poll() is None:
                    _kill_group(process)


def _kill_group(process: subprocess.Popen) -> None:
    """Kill `process` and every process of its group (it leads one)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


RUNS = BackgroundRuns()


def background(name: str, run: Run):
    """Declare `run`, and a session fixture named `name`: its output, once finished."""
    RUNS.declare(name, run)

    @pytest.fixture(scope="session", name=name)
    def finished() -> subprocess.CompletedProcess:
        return RUNS.result(name)

    return finished


class Group(Mapping[str, subprocess.CompletedProcess]):
    """Runs declared together, by key; reading one waits for that one only."""

    def __init__(self, name: str, keys: list[str]) -> None:
        self._name = name
        self._keys = keys

    def __getitem__(self, key: str) -> subprocess.CompletedProcess:
        if key not in self._keys:
            raise KeyError(key)
        return RUNS.result(f"{self._name}:{key}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def background_group(name: str, runs: Mapping[str, Run]):
    """Declare each of `runs` (as NAME:KEY), and a session fixture named `name`: a `Group`."""
    for key, run in runs.items():
        RUNS.declare(f"{name}:{key}", run)

    @pytest.fixture(scope="session", name=name)
    def finished() -> Group:
        return Group(name, list(runs))

    return finished
