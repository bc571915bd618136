"""Bytes on node links: msgpack frames of tagged dataclass messages.

A frame is a msgpack array of messages, so everything queued for a link travels in one frame.
A message is `[tag, field, field, ...]`, where `tag` names a registered frozen dataclass and the
fields follow in declaration order; nested registered dataclasses (a `Gossip`'s members) are
encoded the same way. Decoding checks every field against the dataclass's type hints, so a
malformed frame from another node is a `WireError`, never a crash or a half-built message.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping

import msgpack

MAX_FRAME = 1024 * 1024


class WireError(ValueError):
    """A frame that is not a valid sequence of known messages."""


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

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, messages: Iterable[object]) -> bytes:
        frame = msgpack.packb([self._to_wire(m) for m in messages], use_bin_type=True)
        if len(frame) > MAX_FRAME:
            raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
        return frame

    def _to_wire(self, message: object) -> list:
        tag = self._tags.get(type(message))
        if tag is None:
            raise TypeError(f"not a registered message: {message!r}")
        return [
            tag,
            *(
                self._value_to_wire(getattr(message, name))
                for name, _ in self._fields[type(message)]
            ),
        ]

    def _value_to_wire(self, value: object) -> object:
        if type(value) in self._tags:
            return self._to_wire(value)
        if isinstance(value, tuple | list):
            return [self._value_to_wire(v) for v in value]
        if isinstance(value, Mapping):
            return dict(value)
        return value

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
        fields = self._fields[cls]
        if len(item) - 1 != len(fields):
            raise WireError(
                f"{where}: {cls.__name__} takes {len(fields)} fields, got {len(item) - 1}"
            )
        values = {
            name: self._check(value, hint, f"{cls.__name__}.{name}")
            for (name, hint), value in zip(fields, item[1:], strict=True)
        }
        return cls(**values)

    def _check(self, value: object, hint: object, where: str) -> object:
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            for option in typing.get_args(hint):
                try:
                    return self._check(value, option, where)
                except WireError:
                    continue
            raise WireError(f"{where}: {type(value).__name__} fits none of {hint}")
        if hint is type(None):
            if value is None:
                return None
        elif hint is bool:
            if type(value) is bool:
                return value
        elif hint is int:
            if type(value) is int:
                return value
        elif hint is float:
            if type(value) in (int, float):
                return float(value)
        elif hint is str:
            if type(value) is str:
                return value
        elif hint is bytes:
            if type(value) is bytes:
                return value
        elif hint in self._tags:
            return self._from_wire(value, where, expected=hint)
        elif origin is list:
            (element,) = typing.get_args(hint)
            if isinstance(value, list):
                return [self._check(v, element, f"{where}[]") for v in value]
        elif origin is tuple:
            (element, _ellipsis) = typing.get_args(hint)
            if isinstance(value, list):
                return tuple(self._check(v, element, f"{where}[]") for v in value)
        elif origin in (Mapping, dict):
            key_hint, value_hint = typing.get_args(hint)
            if isinstance(value, dict):
                return {
                    self._check(k, key_hint, f"{where} key"): self._check(
                        v, value_hint, f"{where}[]"
                    )
                    for k, v in value.items()
                }
        else:
            raise TypeError(f"{where}: unsupported type hint {hint!r}")
        raise WireError(
            f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}"
        )
