"""Server processes of the systems bench/cluster_vs_peers.py compares: started in a session of
their own, so that a kill takes the whole group and a Ctrl-C at the terminal reaches only the
bench, which then stops them; every wait bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

STOP_WITHIN = 10.0
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time process `pid` has used, all its threads, dead ones included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


def machine_busy_seconds() -> float:
    """CPU seconds every process on the machine has used since it booted, all cores."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / TICKS_PER_SECOND


class Server:
    """One server process with its output in `log`."""

    def __init__(self, name: str, command: list[str], log: Path, cwd: Path | None = None) -> None:
        self.name = name
        self.command = command
        self.log = log
        self.cwd = cwd
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> Server:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL to its whole process group: it loses everything it held in memory at once."""
        self._signal_group(signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it is still there after STOP_WITHIN seconds."""
        if not self.running():
            self._reap()
            return
        self._signal_group(signal.SIGTERM)
        try:
            assert self.process is not None
            self.process.wait(STOP_WITHIN)
        except subprocess.TimeoutExpired:
            self.kill()

    def _signal_group(self, signum: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def _reap(self) -> None:
        if self.process is not None:
            try:
                self.process.wait(STOP_WITHIN)
            except subprocess.TimeoutExpired:
                pass

    def output(self, last: int = 2000) -> str:
        """The end of what it printed, for an error message."""
        try:
            return self.log.read_text(errors="replace")[-last:]
        except OSError:
            return ""


def wait_for(predicate: Callable[[], bool], within: float, what: str) -> None:
    """Poll `predicate` every 50 ms until it holds; RuntimeError after `within` seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {within:g} s: {what}")
        time.sleep(0.05)
