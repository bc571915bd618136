"""The three systems bench/cluster_vs_peers.py compares, each behind the same few verbs."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from .workloads import Run, Until, Workload


class System(Protocol):
    """Three members on loopback and one client of the system's own, driven by workers."""

    # Its name on the command line (`--systems`) and in the tables.
    name: str

    def missing(self) -> str | None:
        """What this machine lacks to run it (a server, a client library), if anything."""

    def describe(self) -> str:
        """One line: versions, members, client, and which member the client talks to."""

    def start(self, workdir: Path) -> None:
        """Start three members under `workdir` and wait (bounded) until they serve."""

    def members(self) -> dict[str, int]:
        """The process id of each member still running, by its name."""

    def serving(self) -> str:
        """The member that serves the locks of the workloads (the one a failover kills)."""

    def serving_role(self) -> str:
        """What that member is, in words: the slot's owner, the leader."""

    def kill(self, member: str) -> None:
        """SIGKILL `member`."""

    def drive(self, workload: Workload, run: Run, until: Until, within: float) -> None:
        """Connect a client, then run `workload`'s workers into `run` until `until(run)`,
        `within` seconds at most; the client is closed when it returns."""

    def stop(self) -> None:
        """Stop every process it started (idempotent; safe after a failed start)."""
