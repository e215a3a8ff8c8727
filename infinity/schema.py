"""Request bodies as data: one definition both checks a body and describes it in the OpenAPI document.

A check returns the value cleaned (defaults filled in, explicit nulls of optional fields dropped) or raises
the error the client should see: 400 for an empty input, 413 for more inputs than allowed, 422 otherwise.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infinity.errors import EmptyInput, PayloadTooLarge, ValidationError

_NOTHING = object()
# characters a tokenizer drops entirely: an input made only of these (or whitespace) has no text
_INVISIBLE = "\u0000\u200b\u200c\u200d\u2060\ufeff\u00ad"


def blank(text: str) -> bool:
    return not text.strip().strip(_INVISIBLE).strip()


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
            doc.update(minLength=1, pattern=r"\S")
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
    minimum: int | None = None
    maximum: int | None = None
    description: str = ""
    default: Any = _NOTHING

    def accepts(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def check(self, value: Any, where: str) -> int:
        if not self.accepts(value):
            raise ValidationError(f"{where} must be an integer")
        if self.minimum is not None and value < self.minimum:
            raise ValidationError(f"{where} must be at least {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise ValidationError(f"{where} must be at most {self.maximum}")
        return value

    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": "integer"}
        if self.minimum is not None:
            doc["minimum"] = self.minimum
        if self.maximum is not None:
            doc["maximum"] = self.maximum
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
    """A JSON object with known fields; unknown fields are named in the error. Null means absent."""
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
        doc: dict[str, Any] = {"type": "object", "properties": {k: v.doc() for k, v in self.fields.items()}}
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

