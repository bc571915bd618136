"""Throttle's durations (humantime strings): what parses, to what, and the errors of what does
not."""

from __future__ import annotations

import pytest

from sluicegate.cluster.durations import DurationError, parse_duration, parse_duration_nanos


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300),
        ("30s", 30),
        ("12h", 43_200),
        ("1h 30m", 5_400),
        ("1m 40s", 100),
        ("1h30m", 5_400),
        ("1M", 2_630_016),
        ("1y", 31_557_600),
        ("2 days", 172_800),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration_nanos(text) == seconds * 1_000_000_000
    assert parse_duration(text) == float(seconds)


def test_parse_duration_milliseconds():
    assert parse_duration_nanos("250ms") == 250_000_000
    assert parse_duration("250ms") == 0.25


def test_parse_duration_minutes_and_months_differ():
    assert parse_duration("1m") == 60.0
    assert parse_duration("1M") == 2_630_016.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "value was empty"),
        ("x", "expected number at 0"),
        ("5", "time unit needed, for example 5sec or 5ms"),
        (
            "5x",
            'unknown time unit "x", supported units: ns, us, ms, sec, min, hours, days, weeks, '
            "months, years (and few variations)",
        ),
        ("5m!", "invalid character at 2"),
    ],
)
def test_parse_duration_errors(text, message):
    with pytest.raises(DurationError) as info:
        parse_duration(text)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)
