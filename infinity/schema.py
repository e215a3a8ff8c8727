"""Request bodies as data: one definition both checks a body and describes it in the OpenAPI document.

A check returns the value cleaned (defaults filled in, explicit nulls of optional fields dropped) or raises
the error the client should see: 400 for an empty input, 413 for more inputs than allowed, 422 otherwise.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infinity.errors import EmptyInput, PayloadTooLarge, ValidationError

_NOTHING = object()
# Whitespace, control and format characters (Unicode 14: White_Space, Cc, Cf) of the Basic Multilingual Plane:
# tokenizers drop them or read them as separators, so an input made only of these has no text. Written out
# rather than looked up, so the server and its published pattern agree whatever Unicode version Python has.
BLANK_RANGES = ((0x0000, 0x0020), (0x007f, 0x00a0), (0x00ad, 0x00ad), (0x0600, 0x0605), (0x061c, 0x061c),
                (0x06dd, 0x06dd), (0x070f, 0x070f), (0x0890, 0x0891), (0x08e2, 0x08e2), (0x1680, 0x1680),
                (0x180e, 0x180e), (0x2000, 0x200f), (0x2028, 0x202f), (0x205f, 0x2064), (0x2066, 0x206f),
                (0x3000, 0x3000), (0xfeff, 0xfeff), (0xfff9, 0xfffb))
# "has a character outside BLANK_RANGES": \uXXXX escapes only, which ECMA-262 (JSON Schema's regex dialect)
# and Python's re read alike, so validators in any language judge a text as the server does
VISIBLE = "[^" + "".join(f"\\u{low:04x}" + (f"-\\u{high:04x}" if high > low else "")
                         for low, high in BLANK_RANGES) + "]"
_VISIBLE = re.compile(VISIBLE)
# JSON integers the schema admits: a signed 64-bit range, what JSON parsers in most languages hold exactly
INT64 = (-(2 ** 63), 2 ** 63 - 1)


def blank(text: str) -> bool:
    return _VISIBLE.search(text) is None


def nullable(doc: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI 3.0's nullable, which does not widen an enum: null is listed there too."""
    doc = {**doc, "nullable": True}
    if "enum" in doc:
        doc["enum"] = [*doc["enum"], None]
    return doc


class Schema:
    description: str = ""
    default: Any = _NOTHING

    def accepts(self, value: Any) -> bool:
        """A shallow type test, to pick an alternative of a OneOf."""
        raise NotImplementedError

    def check(self, value: Any, where: str) -> Any:
        raise NotImplementedError

    def doc(self) -> dict[str, Any]:
        raise NotImplementedError

    def _describe(self, doc: dict[str, Any]) -> dict[str, Any]:
        if self.description:
            doc["description"] = self.description
        if self.default is not _NOTHING:
            doc["default"] = self.default
        return doc


@dataclass(frozen=True)
class Text(Schema):
    """A string with something in it (whitespace and invisible characters alone count as empty)."""
    description: str = ""
    default: Any = _NOTHING
    allow_blank: bool = False

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)

    def check(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise ValidationError(f"{where} must be a string")
        if not self.allow_blank and blank(value):
            raise EmptyInput(f"{where} is empty")
        return value

    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": "string"}
        if not self.allow_blank:
            doc.update(minLength=1, pattern=VISIBLE)
        return self._describe(doc)


@dataclass(frozen=True)
class Choice(Schema):
    """One of `values`; case_insensitive also takes each value Capitalized and UPPERCASE (as TEI and the
    transformers pipeline spell them) and answers the lowercase value."""
    values: tuple[str, ...]
    description: str = ""
    default: Any = _NOTHING
    case_insensitive: bool = False

    @property
    def spellings(self) -> dict[str, str]:
        if not self.case_insensitive:
            return {value: value for value in self.values}
        return {form: value for value in self.values for form in (value, value.capitalize(), value.upper())}

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)

    def check(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or value not in self.spellings:
            raise ValidationError(f"{where} must be one of {', '.join(self.values)}")
        return self.spellings[value]

    def doc(self) -> dict[str, Any]:
        return self._describe({"type": "string", "enum": list(self.spellings)})


@dataclass(frozen=True)
class Refused(Schema):
    """A field this model takes no value of (prompt_name on a model without prompts): named, so the answer says why
    rather than calling the field unknown; `not: {}` in the document, which no value matches."""
    description: str

    def accepts(self, value: Any) -> bool:
        return True

    def check(self, value: Any, where: str) -> Any:
        raise ValidationError(f"unknown {where} {value!r}: {self.description}")

    def doc(self) -> dict[str, Any]:
        return self._describe({"not": {}})


@dataclass(frozen=True)
class Boolean(Schema):
    description: str = ""
    default: Any = _NOTHING

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)

    def check(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise ValidationError(f"{where} must be true or false")
        return value

    def doc(self) -> dict[str, Any]:
        return self._describe({"type": "boolean"})


@dataclass(frozen=True)
class Integer(Schema):
    """An integer within [minimum, maximum], each defaulting to the signed 64-bit bound."""
    minimum: int | None = None
    maximum: int | None = None
    description: str = ""
    default: Any = _NOTHING

    @property
    def bounds(self) -> tuple[int, int]:
        return (INT64[0] if self.minimum is None else self.minimum,
                INT64[1] if self.maximum is None else self.maximum)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def check(self, value: Any, where: str) -> int:
        if not self.accepts(value):
            raise ValidationError(f"{where} must be an integer")
        low, high = self.bounds
        if value < low:
            raise ValidationError(f"{where} must be at least {low}")
        if value > high:
            raise ValidationError(f"{where} must be at most {high}")
        return int(value)

    def doc(self) -> dict[str, Any]:
        low, high = self.bounds
        return self._describe({"type": "integer", "minimum": low, "maximum": high})


@dataclass(frozen=True)
class Number(Schema):
    """A finite number, at least `minimum`."""
    minimum: float | None = None
    description: str = ""
    default: Any = _NOTHING

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def check(self, value: Any, where: str) -> float:
        if not self.accepts(value) or not math.isfinite(value):
            raise ValidationError(f"{where} must be a number")
        if self.minimum is not None and value < self.minimum:
            raise ValidationError(f"{where} must be at least {self.minimum:g}")
        return float(value)

    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": "number"}
        if self.minimum is not None:
            doc["minimum"] = self.minimum
        return self._describe(doc)


@dataclass(frozen=True)
class Array(Schema):
    """A list; fewer than min_items is an empty input (400), more than max_items is too large (413)."""
    items: Schema
    min_items: int = 1
    max_items: int | None = None
    length: int | None = None  # a fixed-length tuple, e.g. a [text, text_pair] pair
    description: str = ""
    default: Any = _NOTHING

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, list):
            return False
        if self.length is not None and len(value) != self.length:
            return False
        return not value or self.items.accepts(value[0])

    def check(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise ValidationError(f"{where} must be a list")
        if self.length is not None and len(value) != self.length:
            raise ValidationError(f"{where} must have exactly {self.length} items")
        if len(value) < self.min_items:
            raise EmptyInput(f"{where} is empty")
        if self.max_items is not None and len(value) > self.max_items:
            raise PayloadTooLarge(f"{where} has {len(value)} items; the limit is {self.max_items}")
        return [self.items.check(item, f"{where}[{i}]") for i, item in enumerate(value)]

    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": "array", "items": self.items.doc()}
        low, high = (self.length, self.length) if self.length is not None else (self.min_items, self.max_items)
        if low:
            doc["minItems"] = low
        if high is not None:
            doc["maxItems"] = high
        return self._describe(doc)


@dataclass(frozen=True)
class Object(Schema):
    """A JSON object with known fields; unknown fields are named in the error. Null means absent, so optional
    fields are documented as nullable (huggingface_hub sends null for parameters left unset)."""
    fields: Mapping[str, Schema]
    required: tuple[str, ...] = ()
    open: bool = False  # any other fields are accepted and dropped
    fill_defaults: bool = True  # False: defaults are documented, and applied by the caller after merging
    description: str = ""
    default: Any = _NOTHING

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ValidationError(f"{where} must be a JSON object")
        if not self.open:
            unknown = sorted(set(value) - set(self.fields))
            if unknown:
                raise ValidationError(f"unknown field(s) in {where}: {', '.join(map(str, unknown))}; "
                                      f"allowed: {', '.join(self.fields)}")
        clean: dict[str, Any] = {}
        for name, schema in self.fields.items():
            item = value.get(name)
            if item is None:
                if name in self.required:
                    raise ValidationError(f"{where} has no {name}")
                if self.fill_defaults and schema.default is not _NOTHING:
                    clean[name] = schema.default
                continue
            clean[name] = schema.check(item, f"{where}.{name}" if where != "body" else name)
        return clean

    def doc(self) -> dict[str, Any]:
        properties = {name: schema.doc() if name in self.required else nullable(schema.doc())
                      for name, schema in self.fields.items()}
        doc: dict[str, Any] = {"type": "object", "properties": properties}
        if self.required:
            doc["required"] = list(self.required)
        if not self.open:
            doc["additionalProperties"] = False
        return self._describe(doc)


@dataclass(frozen=True)
class OneOf(Schema):
    """The first alternative whose shallow type matches checks the value; none matching gives `message`."""
    options: tuple[Schema, ...]
    message: str
    description: str = ""
    default: Any = _NOTHING

    def accepts(self, value: Any) -> bool:
        return any(option.accepts(value) for option in self.options)

    def check(self, value: Any, where: str) -> Any:
        for option in self.options:
            if option.accepts(value):
                return option.check(value, where)
        raise ValidationError(f"{where} must be {self.message}")

    def doc(self) -> dict[str, Any]:
        return self._describe({"oneOf": [option.doc() for option in self.options]})

