"""Every JSON-schema keyword is enforced by the grammar or refused in words, never dropped."""

from __future__ import annotations

import pytest

from pagoda.engine.errors import StructuredOutputError
from pagoda.engine.structured_output.json_schema import MAX_SCHEMA_DEPTH, check_schema
from tests.engine.structured_output.schemas import SCHEMAS

_INTS = {"type": "array", "items": {"type": "integer"}}


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"not": {"type": "string"}}, "not"),
    ({**_INTS, "uniqueItems": True}, "uniqueItems"),
    ({"type": "number", "multipleOf": 7}, "multipleOf"),
    ({"type": "integer", "multipleOf": 0.5}, "multipleOf"),
    ({"$ref": "https://example.com/person.json"}, "$ref"),
    ({"$ref": "#/$defs/missing"}, "$ref"),
    ({"if": {"type": "integer"}, "then": {"type": "integer", "minimum": 5}}, "if"),
    ({**_INTS, "contains": {"const": 5}}, "contains"),
    ({"type": "object", "propertyNames": {"type": "string", "pattern": "^a"}}, "propertyNames"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    ({"allOf": [{"type": "integer"}, {"type": "integer", "minimum": 3}]}, "allOf"),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 4}, "minimum"),
    ({"anyOf": [{"type": "string"}], "maxLength": 3}, "maxLength"),
    ({"minimum": 3}, "minimum"),  # no type: xgrammar applies no numeric keyword
    ({"type": "string", "enum": ["a", "bb"], "minLength": 2}, "minLength"),
    ({"type": "string", "enum": [1, "a"]}, "enum"),
    ({"type": "string", "format": "iri"}, "format"),
    ({"type": "string", "nullable": True}, "nullable"),
    ({"type": "object", "bogus": 1}, "bogus"),
    ({"type": "integer", "minimum": float("inf")}, "minimum"),
    ({"type": "array", "items": [{"type": "integer"}]}, "items"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
    ({"type": "object", "properties": {"tags": {**_INTS, "uniqueItems": True}}}, "uniqueItems"),
])
def test_a_keyword_the_grammar_would_not_hold_is_refused_naming_it(schema, keyword):
    with pytest.raises(StructuredOutputError) as caught:
        check_schema(schema)
    assert f"keyword '{keyword}'" in str(caught.value), str(caught.value)


def test_the_refusal_says_where_the_keyword_is():
    schema = {"type": "object", "properties": {"tags": {**_INTS, "uniqueItems": True}}}
    with pytest.raises(StructuredOutputError, match="#/properties/tags"):
        check_schema(schema)


@pytest.mark.parametrize("schema", SCHEMAS)
def test_every_schema_of_the_suite_is_accepted(schema):
    check_schema(schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "title": "Person", "description": "who", "$schema": "x", "examples": [{}],
     "properties": {"name": {"type": "string", "default": "a", "deprecated": False}}},
    {**_INTS, "uniqueItems": False},
    {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Name"},
    {"$defs": {"Cat": {"type": "object", "properties": {"kind": {"const": "cat"}},
                       "required": ["kind"]},
               "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}},
                       "required": ["kind"]}},
     "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]},
    {"oneOf": [{"type": "integer"}, {"type": "string"}]},
    {"type": ["integer", "null"], "minimum": 0, "multipleOf": 5},
    {"type": "string", "enum": ["a", "b"], "title": "Choice"},
])
def test_schemas_whose_every_keyword_is_enforced_are_accepted(schema):
    check_schema(schema)


def test_a_schema_nested_past_the_bound_is_refused_without_recursing():
    schema: dict = {"type": "integer"}
    for _ in range(50_000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(StructuredOutputError, match=f"deeper than {MAX_SCHEMA_DEPTH} levels"):
        check_schema(schema)
