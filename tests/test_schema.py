"""Request schemas: what a check refuses is exactly what the published JSON Schema calls invalid."""
from __future__ import annotations

import unicodedata
from typing import Any

import jsonschema
import pytest

from infinity.errors import EmptyInput, InfinityError, ValidationError
from infinity.schema import BLANK_RANGES, INT64, Array, Boolean, Choice, Integer, Object, Text, blank

BMP = [chr(code) for code in range(0x10000) if not 0xD800 <= code <= 0xDFFF]
BLANK = {chr(code) for low, high in BLANK_RANGES for code in range(low, high + 1)}


def documented(schema: Any, value: Any) -> bool:
    """The verdict of a JSON Schema validator on the published document (OpenAPI's nullable read as type null)."""
    doc = schema.doc()
    for prop in doc.get("properties", {}).values():
        if prop.pop("nullable", False):
            prop["type"] = [prop["type"], "null"]
    return jsonschema.Draft4Validator(doc).is_valid(value)


def served(schema: Any, value: Any) -> bool:
    try:
        schema.check(value, "body")
    except InfinityError:
        return False
    return True


def test_blank_means_whitespace_control_and_format_characters() -> None:
    """The written-out ranges are what Unicode calls whitespace, control (Cc) and format (Cf) in the BMP."""
    expected = {c for c in BMP if c.isspace() or unicodedata.category(c) in ("Cc", "Cf", "Zs", "Zl", "Zp")}
    assert BLANK == expected, sorted(map(hex, map(ord, BLANK ^ expected)))


@pytest.mark.parametrize("text", ["\u2063", "\u001d", "\u200b \u200b \u200b", "\u00a0\u2028\ufeff", "\u0000",
                                  " \t\r\n", "\u00ad\u200d", ""])
def test_invisible_only_texts_are_empty_for_the_server_and_the_schema(text: str) -> None:
    assert blank(text)
    with pytest.raises(EmptyInput):
        Text().check(text, "inputs")
    assert not documented(Text(), text)


@pytest.mark.parametrize("text", ["a", " a ", "\u200ba", "\U0001f600", "\u0301", "\u3001", "\ue000"])
def test_a_visible_character_makes_a_text(text: str) -> None:
    assert not blank(text) and served(Text(), text) and documented(Text(), text)


def test_every_single_character_gets_the_same_verdict_from_server_and_schema() -> None:
    validator = jsonschema.Draft4Validator(Text().doc())
    disagree = [hex(ord(c)) for c in BMP if validator.is_valid(c) != served(Text(), c)]
    assert not disagree
    assert sum(not served(Text(), c) for c in BMP) == len(BLANK)


@pytest.mark.parametrize("value", [INT64[1], INT64[1] + 1, 2 ** 64 - 1, 2 ** 64, -(2 ** 63), 1, 0, 1.0, True])
def test_integers_outside_int64_are_refused_as_the_schema_says(value: Any) -> None:
    assert served(Integer(minimum=0), value) == documented(Integer(minimum=0), value)


def test_integer_bounds_name_the_limit() -> None:
    with pytest.raises(ValidationError, match=f"at most {INT64[1]}"):
        Integer().check(2 ** 63, "top_k")


@pytest.mark.parametrize(("body", "valid"), [
    ({"inputs": "x", "flag": None}, True), ({"inputs": "x", "n": None}, True), ({"inputs": "x", "how": None}, True),
    ({"inputs": "x", "flag": False, "n": 3, "how": "b"}, True), ({"inputs": "x", "how": "c"}, False),
    ({"inputs": None}, False), ({"inputs": ["a", None]}, False), ({}, False)])
def test_null_is_accepted_and_documented_exactly_for_optional_fields(body: dict[str, Any], valid: bool) -> None:
    schema = Object({"inputs": Array(Text()) if isinstance(body.get("inputs"), list) else Text(),
                     "flag": Boolean(default=True), "n": Integer(minimum=1), "how": Choice(("a", "b"))},
                    required=("inputs",))
    assert served(schema, body) == documented(schema, body) == valid
