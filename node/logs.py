"""Logging to stderr, at the level Throttle users already set.

Precedence: `--log-level`, then `SLUICEGATE_LOG`, then `THROTTLE_LOG`, then `[logging.stderr]
level`, then WARN.
Values: ERROR, WARN, INFO, DEBUG, TRACE (case-insensitive).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

TRACE = 5
# The most characters of one argument of a log line: many are chosen by clients or other nodes.
LONGEST_ARGUMENT = 200
_LEVELS = {
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": TRACE,
}


def choose_level(config_level: str | None, flag_level: str | None = None) -> tuple[int, str | None]:
    """The level to log at, and a complaint if an environment variable held nonsense."""
    if flag_level is not None:
        return _LEVELS[flag_level], None
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


# Ways to write a log line: `--log-format`, `SLUICEGATE_LOG_FORMAT`.
FORMATS = ("text", "json")


def setup_logging(level: int, form: str = "text") -> None:
    logging.addLevelName(TRACE, "TRACE")
    handler = logging.StreamHandler(sys.stderr)
    if form == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(
            logging.Formatter(
                "[%(asctime)s %(levelname)-5s %(name)s] %(message)s", "%Y-%m-%dT%H:%M:%S"
            )
        )
    handler.addFilter(ClipArguments())
    root = logging.getLogger("sluicegate")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


class JsonLines(logging.Formatter):
    """A JSON object a line, for log collectors: `time` (UTC, ISO 8601), `level`, `logger`,
    `message`, and `exception` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def clip(text: str, longest: int = LONGEST_ARGUMENT) -> str:
    """`text`, cut to `longest` characters and saying by how many if it was longer."""
    if len(text) <= longest:
        return text
    return f"{text[:longest]}...({len(text) - longest} more characters)"


class _Clipped:
    """An argument of a log line whose text (`%s` or `%r`) is clipped."""

    def __init__(self, value: object) -> None:
        self._value = value

    def __str__(self) -> str:
        return clip(str(self._value))

    def __repr__(self) -> str:
        return clip(repr(self._value))


class ClipArguments(logging.Filter):
    """No argument of a log line longer than `LONGEST_ARGUMENT`: a client that names itself with
    a megabyte must not write a megabyte of log per request."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                arg if isinstance(arg, int | float | None) else _Clipped(arg) for arg in record.args
            )
        return True


class Sparse:
    """A line that others can make a node log at will (a refused link, a refused connection)
    logged at most every `interval` seconds: each says how many it stands for."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.count = 0
        self._logged_at = -float("inf")
        self._count_when_logged = 0

    def due(self, now: float) -> int | None:
        """Count one more; how many since the last line, if a line is due `now`, else None."""
        self.count += 1
        if now - self._logged_at < self.interval:
            return None
        since, self._count_when_logged = self.count - self._count_when_logged, self.count
        self._logged_at = now
        return since
