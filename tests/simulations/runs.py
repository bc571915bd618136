"""The long simulation runs that tests/simulations judge, run in the background from the moment
the session's tests are collected, one after another at the lowest CPU priority.

The rest of `make test` keeps about one core busy and waits on node processes much of the time;
these runs take what it leaves, so the suite lasts about as long as the longer of the two rather
than their sum. At nice 19 they get almost nothing while a test needs both cores. A run is
deterministic (a virtual clock and its seed), so the load around it changes nothing in it.

A test asks for a run by naming it as a fixture (tests/simulations/conftest.py); a run no
collected test names does not start.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIMULATIONS = ROOT / "simulations"
# As many seeds as keep `make test` within 15 minutes here (2 cores).
SEEDS = 64
# Seeds swept with five nodes too (minority and majority splits).
SEEDS_OF_FIVE = 10
# The longest one run may take, and a test may wait for the runs before its own.
RUN_TIMEOUT = 1800.0
WAIT_TIMEOUT = 3600.0


def simulate(*args: str, timeout: float, hash_seed: int = 0) -> subprocess.CompletedProcess:
    """`python -m simulations run ...` in a new process, under PYTHONHASHSEED=`hash_seed`."""
    return subprocess.run(
        _command(args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(hash_seed),
    )


def _command(args: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "simulations", "run", *args]


def _env(hash_seed: int) -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": str(hash_seed)}


def _listed(seeds: list[int], name: str) -> str:
    path = Path(tempfile.mkdtemp(prefix="sluicegate-runs-")) / name
    path.write_text("".join(f"{seed}\n" for seed in seeds))
    return str(path)


def regressions_beyond_the_sweep() -> list[int]:
    """The seeds of regressions.txt beyond the sweep's, but for those whose line says they
    failed as another seed did ("(as seed N)"): each of those was one more sample of a failure
    whose first seed is replayed, and the workload has changed since, so they now run other
    histories, as any seeds would. `run --seeds-from simulations/regressions.txt` runs all."""
    lines = (SIMULATIONS / "regressions.txt").read_text().splitlines()
    rows = [line.split(maxsplit=2) for line in lines if line.strip() and not line.startswith("#")]
    return [
        int(row[0])
        for row in rows
        if int(row[0]) >= SEEDS and not re.search(r"\(as seed \d+[;)]", row[-1])
    ]


def _deep_rows() -> dict[str, list[int]]:
    """The seeds of regressions-deep.txt by their number of nodes."""
    rows: dict[str, list[int]] = {}
    for line in (SIMULATIONS / "regressions-deep.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            seed, nodes = line.split()[:2]
            rows.setdefault(nodes, []).append(int(seed))
    return rows


@cache
def run_args() -> dict[str, tuple[str, ...]]:
    """Each run by name: its arguments (each runs in two processes, `--jobs 2`)."""
    beyond = regressions_beyond_the_sweep()
    skew = str(SIMULATIONS / "regressions-skew.txt")
    five = str(SIMULATIONS / "regressions-five.txt")
    runs = {
        "sweep": ("--seeds", str(SEEDS), "--hashes"),
        "five_node_sweep": ("--seeds", str(SEEDS_OF_FIVE), "--nodes", "5"),
        "regressions": ("--seeds-from", _listed(beyond, "beyond.txt"), "--hashes"),
        "skew_regressions": ("--seeds-from", skew, "--with", "skew,freeze", "--hashes"),
        "five_node_regressions": ("--seeds-from", five, "--nodes", "5", "--hashes"),
    }
    for nodes, seeds in sorted(_deep_rows().items()):
        runs[f"deep_regressions_{nodes}"] = (
            *("--seeds-from", _listed(seeds, f"deep-{nodes}.txt"), "--nodes", nodes),
            *("--with", "skew,freeze", "--availability", "--hashes"),
        )
    return runs


def runs_named(fixture_names: set[str]) -> set[str]:
    """The runs the tests with these fixtures wait for (`deep_regressions`: one per size)."""
    return {
        name
        for name in run_args()
        if name in fixture_names
        or (name.startswith("deep_regressions_") and "deep_regressions" in fixture_names)
    }


class BackgroundRuns:
    """Runs started in a thread of their own, in order; `result` waits for one."""

    def __init__(self) -> None:
        self._done: dict[str, threading.Event] = {}
        self._results: dict[str, subprocess.CompletedProcess | BaseException] = {}
        self._lock = threading.Lock()
        self._running: subprocess.Popen | None = None
        self._stopped = False

    def start(self, names: set[str]) -> None:
        every = run_args()
        chosen = [(name, every[name]) for name in every if name in names]
        for name, _ in chosen:
            self._done[name] = threading.Event()
        threading.Thread(target=self._run_all, args=(chosen,), daemon=True).start()

    def _run_all(self, chosen: list[tuple[str, tuple[str, ...]]]) -> None:
        for name, args in chosen:
            try:
                # nice(1), not os.nice in preexec_fn, which is unsafe beside other threads.
                command = ["nice", "-n", "19", *_command((*args, "--jobs", "2"))]
                self._results[name] = self._run(command)
            except BaseException as error:  # the test that waits for it says so
                self._results[name] = error
            self._done[name].set()

    def _run(self, command: list[str]) -> subprocess.CompletedProcess:
        with self._lock:
            if self._stopped:
                raise RuntimeError("the session ended before this run started")
            # A session of its own: a kill takes the sweep's worker processes with it, which
            # a killed sweep would leave behind.
            self._running = process = subprocess.Popen(
                command,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(0),
                start_new_session=True,
            )
        try:
            stdout, stderr = process.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.communicate()
            raise
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def result(self, name: str) -> subprocess.CompletedProcess:
        """The finished run `name`, started now if nothing started it."""
        if name not in self._done:
            self.start({name})
        if not self._done[name].wait(WAIT_TIMEOUT):
            raise TimeoutError(f"the simulation run {name!r} did not end in {WAIT_TIMEOUT:g} s")
        result = self._results[name]
        if isinstance(result, BaseException):
            raise result
        return result

    def stop(self) -> None:
        """End the run under way, and start no more (the session is over)."""
        with self._lock:
            self._stopped = True
            if self._running is not None and self._running.poll() is None:
                _kill_group(self._running)


def _kill_group(process: subprocess.Popen) -> None:
    """Kill `process` and every process of its session (it leads one)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


RUNS = BackgroundRuns()
