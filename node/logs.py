"""Logging to stderr, at the level Throttle users already set.

Precedence: `SLUICEGATE_LOG`, then `THROTTLE_LOG`, then `[logging.stderr] level`, then WARN.
Values: ERROR, WARN, INFO, DEBUG, TRACE (case-insensitive).
"""

from __future__ import annotations

import logging
import os
import sys

TRACE = 5
_LEVELS = {
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": TRACE,
}


def choose_level(config_level: str | None) -> tuple[int, str | None]:
    """The level to log at, and a complaint if an environment variable held nonsense."""
    for variable in ("SLUICEGATE_LOG", "THROTTLE_LOG"):
        value = os.environ.get(variable)
        if value:
            level = _LEVELS.get(value.strip().upper())
            if level is None:
                return _LEVELS.get(config_level or "WARN", logging.WARNING), (
                    f"{variable}={value!r} is not one of ERROR, WARN, INFO, DEBUG, TRACE; ignored."
                )
            return level, None
    return _LEVELS[config_level or "WARN"], None


def setup_logging(level: int) -> None:
    logging.addLevelName(TRACE, "TRACE")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[%(asctime)s %(levelname)-5s %(name)s] %(message)s", "%Y-%m-%dT%H:%M:%S")
    )
    root = logging.getLogger("sluicegate")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
