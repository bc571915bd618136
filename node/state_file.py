"""What a node keeps on disk across its lives, when `[cluster] state_dir` names a directory:
the largest era it entered or accepted a cold start of (a single node: the fencing epoch of
its last life), and the generation of its last life. Its next life's cold start goes above
that era, so fencing tokens rise across a cold start of the whole cluster whatever the clocks
say, and its next generation is larger, so its new life is told from the old one even after
the wall clock stepped back (docs/cluster.md, "Eras across cold starts").

The era is written, and synced, before anything that says this life is in it leaves the node.
Memory stays the only store of everything else: locks and leases are rebuilt from quorums and
from clients' restores, as without the directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError

NAME = "state.json"


class StateError(ConfigError):
    """The state file cannot be read or written; the message names it."""


@dataclass(frozen=True)
class Kept:
    era: int = 0
    generation: int = 0


class StateFile:
    def __init__(self, directory: Path) -> None:
        self.path = directory / NAME

    def check(self) -> None:
        """Refuse to start with a directory this node cannot keep its state in."""
        directory = self.path.parent
        if not directory.is_dir():
            raise StateError(f"cluster.state_dir: {directory} is not a directory")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise StateError(f"cluster.state_dir: {directory} is not writable by this process")
        self.read()

    def read(self) -> Kept:
        """What the last life kept; nothing (zeros) for a node that never kept anything."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return Kept()
        except (OSError, ValueError) as error:
            raise StateError(f"cannot read {self.path}: {error}") from None
        if not (
            isinstance(data, dict)
            and all(
                isinstance(data.get(key), int) and data[key] >= 0 for key in ("era", "generation")
            )
        ):
            raise StateError(f"{self.path} is not a state file of sluicegate: {data!r:.200}")
        return Kept(data["era"], data["generation"])

    def write(self, kept: Kept) -> None:
        """Replace the file with `kept`, synced to the disk before this returns: a crash leaves
        either the old file or the new, whole."""
        directory = self.path.parent
        temporary = directory / f".{NAME}.{os.getpid()}"
        text = json.dumps({"era": kept.era, "generation": kept.generation})
        try:
            with open(temporary, "w") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
            handle = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
        except OSError as error:
            raise StateError(f"cannot write {self.path}: {error}") from None
