"""Decode request bodies and query strings the way Throttle's axum/serde stack does.

Throttle's clients see serde's words when they send something malformed, so the shell reproduces
the same statuses and message prefixes:

* a body that is not JSON: 400 `Failed to parse the request body as JSON: <serde_json syntax error>`
* JSON of the wrong shape: 422 `Failed to deserialize the JSON body into the target type: <error>`
* a bad query string: 400 `Failed to deserialize query string: <error>`

The part after the colon follows serde's vocabulary (`missing field`, `invalid type: string "x",
expected i64`, ...). serde_json also appends `at line L column C`; that suffix is left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import unquote_to_bytes

from sluicegate.cluster.durations import DurationError, parse_duration

I64 = (-(2**63), 2**63 - 1)
U64 = (0, 2**64 - 1)


class JsonSyntaxError(ValueError):
    """Not JSON at all (400)."""


class ShapeError(ValueError):
    """JSON (or a query string) of the wrong shape; `str()` is serde's message (422 / 400)."""


# -- JSON syntax ------------------------------------------------------------------------------

_SYNTAX_WORDS = {
    "Expecting value": "expected value",
    "Extra data": "trailing characters",
    "Expecting property name enclosed in double quotes": "key must be a string",
    "Expecting ':' delimiter": "expected `:`",
    "Expecting ',' delimiter": "expected `,` or `}`",
    "Unterminated string starting at": "EOF while parsing a string",
    "Invalid control character at": (
        "control character (\\u0000-\\u001F) found while parsing a string"
    ),
    "Invalid \\escape": "invalid escape",
    "Invalid \\uXXXX escape": "invalid escape",
}


def _reject_constant(name: str) -> object:
    # serde_json has no NaN or Infinity; Python's json would accept them.
    raise JsonSyntaxError("expected value")


# Digits of the longest integer serde_json keeps as one (u64 or i64); longer ones it reads as a
# float. Python's int() refuses more than 4,300 digits with an error of its own.
_INTEGER_DIGITS = 20


def _number(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JsonSyntaxError("number out of range")
    return value


def _integer(text: str) -> int | float:
    return int(text) if len(text.lstrip("-")) <= _INTEGER_DIGITS else _number(text)


def parse_json(body: bytes) -> object:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise JsonSyntaxError("invalid unicode code point") from None
    if not text.strip():
        raise JsonSyntaxError("EOF while parsing a value")
    try:
        return json.loads(
            text, parse_constant=_reject_constant, parse_int=_integer, parse_float=_number
        )
    except JsonSyntaxError:
        raise
    except json.JSONDecodeError as error:
        words = _SYNTAX_WORDS.get(error.msg, error.msg[:1].lower() + error.msg[1:])
        if error.msg == "Expecting value" and error.pos >= len(text.rstrip()):
            words = "EOF while parsing a value"
        raise JsonSyntaxError(words) from None
    except RecursionError:
        raise JsonSyntaxError("recursion limit exceeded") from None


# -- shapes -----------------------------------------------------------------------------------


def describe(value: object) -> str:
    """How serde names a value it did not expect."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value!r}`"
    if isinstance(value, str):
        return "string " + json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "sequence"
    return "map"


def _at(path: str, message: str) -> ShapeError:
    return ShapeError(f"{path}: {message}" if path else message)


def integer(value: object, bounds: tuple[int, int], type_name: str, path: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _at(path, f"invalid type: {describe(value)}, expected {type_name}")
    if not bounds[0] <= value <= bounds[1]:
        raise _at(path, f"invalid value: {describe(value)}, expected {type_name}")
    return value


def duration(value: object, path: str = "") -> float:
    if not isinstance(value, str):
        raise _at(path, f"invalid type: {describe(value)}, expected a duration")
    try:
        return parse_duration(value)
    except DurationError as error:
        raise _at(path, str(error)) from None


def struct(value: object, name: str, fields: dict[str, Callable[[object, str], object]]) -> dict:
    """Check a JSON object against `fields` (name -> converter(value, path)); extra keys ignored.

    Like serde, a struct may also come as an array of its fields in declaration order.
    """
    if isinstance(value, list):
        if len(value) < len(fields):
            raise ShapeError(
                f"invalid length {len(value)}, expected struct {name} with {len(fields)} "
                f"element{'s' if len(fields) != 1 else ''}"
            )
        if len(value) > len(fields):
            raise ShapeError(f"invalid length {len(value)}, expected fewer elements in array")
        value = dict(zip(fields, value, strict=True))
    if not isinstance(value, dict):
        raise ShapeError(f"invalid type: {describe(value)}, expected struct {name}")
    result = {}
    for key, convert in fields.items():
        if key not in value:
            raise ShapeError(f"missing field `{key}`")
        result[key] = convert(value[key], key)
    return result


# -- query strings ----------------------------------------------------------------------------


def _form_decode(part: bytes) -> str:
    return unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8", errors="replace")


def parse_query(query: bytes, fields: dict[str, Callable[[str], object]], required=()) -> dict:
    """Decode `a=1&b=2` as serde_urlencoded does: unknown keys ignored, duplicates refused."""
    result: dict[str, object] = {}
    for pair in query.split(b"&"):
        if not pair:
            continue
        raw_key, _, raw_value = pair.partition(b"=")
        key = _form_decode(raw_key)
        convert = fields.get(key)
        if convert is None:
            continue
        if key in result:
            raise ShapeError(f"duplicate field `{key}`")
        result[key] = convert(_form_decode(raw_value))
    for key in required:
        if key not in result:
            raise ShapeError(f"missing field `{key}`")
    return result


def query_duration(text: str) -> float:
    try:
        return parse_duration(text)
    except DurationError:
        raise ShapeError(
            f"invalid value: string {json.dumps(text, ensure_ascii=False)}, expected a duration"
        ) from None
