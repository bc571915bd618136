"""Bytes on node links: msgpack frames of tagged dataclass messages.

A frame is a msgpack array of messages, so everything queued for a link travels in one frame.
A message is `[tag, field, field, ...]`, where `tag` names a registered frozen dataclass and the
fields follow in declaration order; nested registered dataclasses (a `Gossip`'s members) are
encoded the same way. Decoding checks every field against the dataclass's type hints, so a
malformed frame from another node is a `WireError`, never a crash or a half-built message.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Iterable, Mapping

import msgpack

MAX_FRAME = 1024 * 1024


class WireError(ValueError):
    """A frame that is not a valid sequence of known messages."""


Check = typing.Callable[[object, str], object]


class Codec:
    def __init__(self, messages: Mapping[int, type]) -> None:
        self._by_tag: dict[int, type] = dict(messages)
        self._tags: dict[type, int] = {cls: tag for tag, cls in self._by_tag.items()}
        if len(self._tags) != len(self._by_tag):
            raise ValueError("one tag per message class")
        self._fields = {
            cls: [(f.name, typing.get_type_hints(cls)[f.name]) for f in dataclasses.fields(cls)]
            for cls in self._tags
        }
        # Per class, where a decoding error is said to be for each field, and its check (made
        # once from the type hint: decoding runs on every frame of every link).
        self._checks: dict[type, tuple[tuple[str, ...], tuple[Check, ...]]] = {
            cls: (
                tuple(f"{cls.__name__}.{name}" for name, _ in self._fields[cls]),
                tuple(self._compile(hint) for _, hint in self._fields[cls]),
            )
            for cls in self._tags
        }
        self._values = {
            cls: _values_of([name for name, _ in fields]) for cls, fields in self._fields.items()
        }

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, messages: Iterable[object]) -> bytes:
        # msgpack packs what it knows itself, and asks `_to_wire` for each message.
        frame = msgpack.packb(list(messages), use_bin_type=True, default=self._to_wire)
        if len(frame) > MAX_FRAME:
            raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
        return frame

    def _to_wire(self, message: object) -> list | dict:
        tag = self._tags.get(type(message))
        if tag is not None:
            return [tag, *self._values[type(message)](message)]
        if isinstance(message, Mapping):
            return dict(message)
        raise TypeError(f"not a registered message: {message!r}")

    # -- decoding ---------------------------------------------------------------------------

    def decode(self, frame: bytes) -> list[object]:
        if len(frame) > MAX_FRAME:
            raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
        try:
            items = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
            raise WireError(f"not msgpack: {error}") from None
        if not isinstance(items, list):
            raise WireError("a frame is an array of messages")
        return [self._from_wire(item, "message") for item in items]

    def _from_wire(self, item: object, where: str, expected: type | None = None) -> object:
        if not isinstance(item, list) or not item or type(item[0]) is not int:
            raise WireError(f"{where}: expected [tag, fields...]")
        cls = self._by_tag.get(item[0])
        if cls is None:
            raise WireError(f"{where}: unknown message tag {item[0]}")
        if expected is not None and cls is not expected:
            raise WireError(f"{where}: expected {expected.__name__}, got {cls.__name__}")
        wheres, checks = self._checks[cls]
        if len(item) - 1 != len(checks):
            raise WireError(
                f"{where}: {cls.__name__} takes {len(checks)} fields, got {len(item) - 1}"
            )
        return cls(*map(_apply, checks, item[1:], wheres))

    def _compile(self, hint: object) -> Check:
        """A check of a decoded value against `hint`: the value as the message holds it, or a
        `WireError` saying where and what is wrong."""
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            args = typing.get_args(hint)
            options = [self._compile(option) for option in args]
            # The options tried first, without an error raised for each that does not fit: a
            # scalar of one of the types named, and a message by its tag.
            scalars = tuple(a for a in args if a in (type(None), bool, int, str, bytes))
            tagged = {self._tags[a]: a for a in args if a in self._tags}

            def union(value: object, where: str) -> object:
                if type(value) in scalars:
                    return value
                if tagged and type(value) is list and value and type(value[0]) is int:
                    cls = tagged.get(value[0])
                    if cls is not None:
                        try:
                            return self._from_wire(value, where, expected=cls)
                        except WireError:
                            pass
                for option in options:
                    try:
                        return option(value, where)
                    except WireError:
                        continue
                raise WireError(f"{where}: {type(value).__name__} fits none of {hint}")

            return union
        if hint in self._tags:
            return lambda value, where: self._from_wire(value, where, expected=hint)
        if hint is float:

            def number(value: object, where: str) -> object:
                if type(value) is float:
                    return value
                if type(value) is int:
                    return float(value)
                raise _mismatch(hint, value, where)

            return number
        if hint in (type(None), bool, int, str, bytes):
            exact = hint

            def scalar(value: object, where: str) -> object:
                if type(value) is exact:
                    return value
                raise _mismatch(hint, value, where)

            return scalar
        if origin in (list, tuple):
            element = typing.get_args(hint)[0]
            check = self._compile(element)
            build = list if origin is list else tuple
            plain = element in (int, str, bool)

            def sequence(value: object, where: str) -> object:
                if not isinstance(value, list):
                    raise _mismatch(hint, value, where)
                if plain and all(type(v) is element for v in value):
                    return value if build is list else tuple(value)
                inner = f"{where}[]"
                return build([check(v, inner) for v in value])

            return sequence
        if origin in (Mapping, dict):
            key_check, value_check = (self._compile(h) for h in typing.get_args(hint))

            def mapping(value: object, where: str) -> object:
                if not isinstance(value, dict):
                    raise _mismatch(hint, value, where)
                key_where, value_where = f"{where} key", f"{where}[]"
                return {
                    key_check(k, key_where): value_check(v, value_where) for k, v in value.items()
                }

            return mapping
        raise TypeError(f"unsupported type hint {hint!r}")


def _values_of(names: list[str]) -> typing.Callable[[object], tuple]:
    """A message's field values in order, as a tuple."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        [name] = names
        return lambda message: (getattr(message, name),)
    return lambda message: ()


def _apply(check: Check, value: object, where: str) -> object:
    return check(value, where)


def _mismatch(hint: object, value: object, where: str) -> WireError:
    name = getattr(hint, "__name__", hint)
    return WireError(f"{where}: expected {name}, got {type(value).__name__}")
