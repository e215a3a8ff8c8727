"""JSON into the manifest's dataclasses, checking every value against its annotation.

A wrong value is a ValueError whose message names the field (`model.file must be a string, not 3`),
so a broken manifest is refused in one line, never with a traceback from deep inside the server.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from typing import Any, TypeVar

T = TypeVar("T")
NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}


def conform(cls: type[T], data: Any, where: str) -> T:
    """An instance of the dataclass `cls` built from `data`, or a ValueError naming the first bad field."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'the manifest'} must be an object, not {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown field {_join(where, str(unknown[0]))}")
    values = {}
    for name, spec in fields.items():
        path = _join(where, name)
        if name in data:
            values[name] = _value(data[name], hints[name], path)
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise ValueError(f"missing field {path}")
    return cls(**values)


def _value(value: Any, hint: Any, where: str) -> Any:
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            raise ValueError(f"{where} must be one of {', '.join(str(m.value) for m in hint)}, "
                             f"not {_show(value)}") from None
    if dataclasses.is_dataclass(hint):
        return conform(hint, value, where)  # type: ignore[arg-type]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _value(value, options[0], where)
        for option in options:
            try:
                return _value(value, option, where)
            except ValueError:
                pass
        raise ValueError(f"{where} must be {' or '.join(_name(o) for o in options)}, not {_show(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where} must be a list, not {_show(value)}")
        return [_value(item, args[0], f"{where}[{index}]") for index, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object, not {_show(value)}")
        return {_key(key, args[0], where): _value(item, args[1], f"{where}.{key}") for key, item in value.items()}
    if _is(value, hint):
        return float(value) if hint is float else value
    raise ValueError(f"{where} must be {_name(hint)}, not {_show(value)}")


def _key(key: str, hint: Any, where: str) -> Any:
    if hint is int:
        # JSON object keys are strings; integer-keyed maps (id2label) are written with their digits
        if not (key.isdigit() and key.isascii()):
            raise ValueError(f"{where} keys must be integers, not {key!r}")
        return int(key)
    return key


def _is(value: Any, hint: Any) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


def _name(hint: Any) -> str:
    return NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
