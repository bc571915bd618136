"""Human-readable durations exactly as Throttle reads them (Rust's `humantime::parse_duration`).

`"5m"`, `"30s"`, `"250ms"`, `"1h 30m"`, `"1h30m"`, `"2 days"`: numbers followed by units,
components summed. `m` is minutes and `M` months. The error texts are humantime's, because
Throttle puts them in its 400/422 answers.
"""

from __future__ import annotations

_NANOS = 1
_MICROS = 1_000
_MILLIS = 1_000_000
_SECOND = 1_000_000_000

_UNITS: dict[str, int] = {}
for _names, _nanos in (
    (("nanos", "nsec", "ns"), _NANOS),
    (("usec", "us", "µs"), _MICROS),
    (("millis", "msec", "ms"), _MILLIS),
    (("seconds", "second", "secs", "sec", "s"), _SECOND),
    (("minutes", "minute", "min", "mins", "m"), 60 * _SECOND),
    (("hours", "hour", "hr", "hrs", "h"), 3600 * _SECOND),
    (("days", "day", "d"), 86_400 * _SECOND),
    (("weeks", "week", "w"), 7 * 86_400 * _SECOND),
    (("months", "month", "M"), 2_630_016 * _SECOND),  # 30.44 days, as humantime counts a month
    (("years", "year", "y"), 31_557_600 * _SECOND),  # 365.25 days
):
    for _name in _names:
        _UNITS[_name] = _nanos

# Rust's Duration holds u64 seconds; anything larger is "number is too large".
_MAX_NANOS = (2**64) * _SECOND - 1


class DurationError(ValueError):
    """The text is not a humantime duration; `str()` is humantime's own message."""


def _is_letter(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z") or c == "µ"


def parse_duration_nanos(text: str) -> int:
    """Parse a humantime duration into whole nanoseconds."""
    # The structure mirrors humantime's parser so that its error offsets come out the same.
    total = 0
    i, n = 0, len(text)

    def skip_to_number(i: int) -> tuple[int | None, int]:
        start = i
        while i < n:
            c = text[i]
            if c.isdigit() and c.isascii():
                return int(c), i + 1
            if c.isspace():
                i += 1
                continue
            raise DurationError(f"expected number at {start}")
        return None, i

    value, i = skip_to_number(i)
    if value is None:
        raise DurationError("value was empty")
    while True:
        while i < n:
            c = text[i]
            if c.isascii() and c.isdigit():
                value = value * 10 + int(c)
                if value >= 2**64:
                    raise DurationError("number is too large")
            elif c.isspace():
                pass
            elif _is_letter(c):
                break
            else:
                raise DurationError(f"invalid character at {i}")
            i += 1
        unit_start = i
        restart_number = None
        while i < n:
            c = text[i]
            if c.isascii() and c.isdigit():
                restart_number = int(c)
                break
            if c.isspace():
                break
            if not _is_letter(c):
                raise DurationError(f"invalid character at {i}")
            i += 1
        unit = text[unit_start:i]
        if not unit:
            raise DurationError(f"time unit needed, for example {value}sec or {value}ms")
        scale = _UNITS.get(unit)
        if scale is None:
            raise DurationError(
                f"unknown time unit {_rust_debug(unit)}, supported units: ns, us, ms, sec, min, "
                "hours, days, weeks, months, years (and few variations)"
            )
        total += value * scale
        if total > _MAX_NANOS:
            raise DurationError("number is too large")
        if restart_number is not None:
            value, i = restart_number, i + 1
            continue
        value, i = skip_to_number(i)
        if value is None:
            return total


def parse_duration(text: str) -> float:
    """Parse a humantime duration into seconds."""
    return parse_duration_nanos(text) / _SECOND


def _rust_debug(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
