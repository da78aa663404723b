"""Which JSON-schema keywords a constrained reply is held to, checked before a schema compiles.

xgrammar turns a schema into a grammar, but it passes over what it cannot express (`not`,
`uniqueItems`, `contains`, an external `$ref`, a keyword beside `enum`...) with at most a line
on stderr, so a reply could break the schema it was asked to follow. Here every keyword of
every subschema is one this module knows the grammar enforces, an annotation that constrains
nothing (`title`, `description`...), or a refusal naming the keyword, where it is and why.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pagoda.engine.errors import StructuredOutputError

# Schemas nested deeper than this are refused (a person's schema nests a few levels; the
# grammar's own converter recurses once per level).
MAX_SCHEMA_DEPTH = 64

TYPES = frozenset({"string", "integer", "number", "boolean", "null", "array", "object"})
# Say nothing about which values are allowed.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "$schema",
                         "$id", "deprecated", "readOnly", "writeOnly", "discriminator"})
# Where subschemas are defined for `$ref`, and may be used nowhere else.
DEFINITIONS = frozenset({"$defs", "definitions"})
# Keywords enforced for the types they apply to: the schema must name such a type in `type`
# (without one, xgrammar does not apply them).
TYPED_KEYWORDS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), frozenset({"string"})),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"),
                    frozenset({"integer", "number"})),
    "multipleOf": frozenset({"integer"}),
    **dict.fromkeys(("items", "prefixItems", "minItems", "maxItems"), frozenset({"array"})),
    **dict.fromkeys(("properties", "required", "additionalProperties", "patternProperties",
                     "minProperties", "maxProperties"), frozenset({"object"})),
}
# Keywords that stand alone: beside them only annotations (and definitions) are honoured.
ALONE = ("$ref", "anyOf", "oneOf", "allOf")
# `format`s the grammar spells out; others (iri, idn-email, regex...) would pass any string.
FORMATS = frozenset({"date-time", "date", "time", "duration", "email", "hostname", "ipv4",
                     "ipv6", "uri", "uri-reference", "uri-template", "uuid", "json-pointer",
                     "relative-json-pointer"})
# Keywords of JSON Schema a reply is not held to, with what to do instead.
UNSUPPORTED: dict[str, str] = {
    "not": "a grammar cannot exclude a schema's values",
    "uniqueItems": "a grammar cannot keep an array's items distinct; check them in your code",
    "if": "conditional schemas are not enforced; use anyOf of the cases",
    "then": "conditional schemas are not enforced; use anyOf of the cases",
    "else": "conditional schemas are not enforced; use anyOf of the cases",
    "dependentRequired": "dependencies between properties are not enforced",
    "dependentSchemas": "dependencies between properties are not enforced",
    "dependencies": "dependencies between properties are not enforced",
    "contains": "an array's 'contains' is not enforced",
    "minContains": "an array's 'contains' is not enforced",
    "maxContains": "an array's 'contains' is not enforced",
    "propertyNames": "property names are not enforced; list the properties, or use "
                     "patternProperties",
    "unevaluatedProperties": "use additionalProperties",
    "unevaluatedItems": "use items",
    "additionalItems": "use prefixItems and items (JSON Schema 2020-12)",
    "contentEncoding": "a string's encoding is not enforced",
    "contentMediaType": "a string's media type is not enforced",
    "contentSchema": "a string's content is not enforced",
    "$anchor": "refer to subschemas by JSON pointer (#/$defs/name)",
    "$dynamicRef": "refer to subschemas by JSON pointer (#/$defs/name)",
    "$dynamicAnchor": "refer to subschemas by JSON pointer (#/$defs/name)",
    "$recursiveRef": "refer to subschemas by JSON pointer (#/$defs/name)",
    "$recursiveAnchor": "refer to subschemas by JSON pointer (#/$defs/name)",
    "nullable": 'OpenAPI\'s nullable is not JSON Schema: use "type": ["string", "null"]',
}
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


@dataclass(slots=True, frozen=True)
class _Node:
    schema: Any
    pointer: str  # JSON pointer from the root ("" is the root)
    depth: int


def check_schema(schema: Any) -> None:
    """StructuredOutputError naming the first keyword a reply would not be held to, or the
    first malformed one, with its place in the schema; nothing when all are enforced."""
    for node in _subschemas(schema):
        _check_node(node, schema)


def _subschemas(root: Any) -> Iterator[_Node]:
    """Every subschema, depth first, without recursion (a schema may nest deep)."""
    stack = [_Node(root, "", 0)]
    while stack:
        node = stack.pop()
        if node.depth > MAX_SCHEMA_DEPTH:
            raise StructuredOutputError(
                f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels (at "
                f"{_where(node.pointer)}): flatten it, or name repeated parts in $defs")
        if not isinstance(node.schema, (dict, bool)):
            raise StructuredOutputError(
                "the JSON schema must be an object (or true/false), not "
                f"{type(node.schema).__name__} (at {_where(node.pointer)})")
        yield node
        if isinstance(node.schema, dict):
            stack.extend(reversed(list(_children(node))))


def _children(node: _Node) -> Iterator[_Node]:
    schema, depth = node.schema, node.depth + 1
    for key in ("properties", "patternProperties", *DEFINITIONS):
        members = schema.get(key)
        if members is None:
            continue
        _expect(isinstance(members, dict), node, key, "must be an object of schemas")
        for name, sub in members.items():
            yield _Node(sub, f"{node.pointer}/{key}/{_escaped(name)}", depth)
    for key in ("items", "additionalProperties"):
        if key in schema:
            _expect(isinstance(schema[key], (dict, bool)), node, key,
                    "must be a schema (an object, or true/false)" + (
                        "; a list of item schemas is draft 4's form: use prefixItems"
                        if key == "items" else ""))
            yield _Node(schema[key], f"{node.pointer}/{key}", depth)
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        if key in schema:
            branches = schema[key]
            _expect(isinstance(branches, list) and branches, node, key,
                    "must be a non-empty list of schemas")
            for i, sub in enumerate(branches):
                yield _Node(sub, f"{node.pointer}/{key}/{i}", depth)


def _check_node(node: _Node, root: Any) -> None:
    schema = node.schema
    if isinstance(schema, bool):
        return
    _check_types(node)
    alone = [key for key in ALONE if key in schema]
    if alone:
        others = [k for k in schema if k not in ANNOTATIONS and k not in DEFINITIONS
                  and k != alone[0]]
        if others:
            place = "referenced schema" if alone[0] == "$ref" else "branches"
            _refuse(node, others[0], f"is not enforced beside '{alone[0]}': move it into the "
                                     f"{place}")
    for key in schema:
        _check_keyword(node, key)
    if "$ref" in schema:
        _check_ref(node, root)
    if "allOf" in schema and len(schema["allOf"]) > 1:
        _refuse(node, "allOf", "with more than one schema is not enforced; merge them into one "
                               "schema")
    if "oneOf" in schema:
        _check_one_of(node, root)
    for key in ("enum", "const"):
        if key in schema:
            _check_values(node, key)


def _check_keyword(node: _Node, key: str) -> None:
    schema = node.schema
    if key in ANNOTATIONS or key in DEFINITIONS or key in ALONE or key in ("type", "enum",
                                                                           "const"):
        return
    if key == "uniqueItems" and schema[key] is False:
        return  # asks for nothing
    if key in UNSUPPORTED:
        _refuse(node, key, f"is not supported: {UNSUPPORTED[key]}")
    applies_to = TYPED_KEYWORDS.get(key)
    if applies_to is None:
        _refuse(node, key, "is not a JSON Schema keyword this server enforces")
    types = _types(schema)
    if types is None or not types & (applies_to | ({"number"} if key == "multipleOf" else
                                                   set())):
        kinds = " or ".join(sorted(applies_to))
        _refuse(node, key, f"applies to {kinds} values, but the schema's \"type\" does not "
                           f"say {kinds}: give the type it constrains")
    _check_value(node, key, schema[key])


def _check_value(node: _Node, key: str, value: Any) -> None:
    if key in _COUNTS:
        _expect(_is_int(value) and value >= 0, node, key, "must be a whole number, 0 or more")
    elif key in _BOUNDS:
        _expect(_is_int(value) or (_is_number(value) and math.isfinite(value)), node, key,
                "must be a finite number (draft 4's true/false form is not supported)")
    elif key == "multipleOf":
        _expect("number" not in _types(node.schema), node, key,
                "is enforced for integers only: make the type \"integer\"")
        _expect(_is_int(value) and value > 0, node, key, "must be a whole number above 0")
    elif key == "pattern":
        _expect(isinstance(value, str), node, key, "must be a regular expression (a string)")
    elif key == "format":
        _expect(value in FORMATS, node, key,
                f"{value!r} is not a format this server enforces (it enforces "
                f"{', '.join(sorted(FORMATS))})")
    elif key == "required":
        _expect(isinstance(value, list) and all(isinstance(v, str) for v in value), node, key,
                "must be a list of property names")


def _check_types(node: _Node) -> None:
    if "type" not in node.schema:
        return
    given = node.schema["type"]
    names = given if isinstance(given, list) else [given]
    _expect(bool(names) and all(isinstance(t, str) and t in TYPES for t in names)
            and len(set(names)) == len(names), node, "type",
            f"is {given!r}; it must be one of {', '.join(sorted(TYPES))}, or a list of "
            "distinct ones")


def _check_values(node: _Node, key: str) -> None:
    """Beside enum or const the grammar lists the values and keeps no other keyword: those
    values must all be of the given type, and nothing else may narrow them."""
    schema = node.schema
    values = schema[key] if key == "enum" else [schema[key]]
    _expect(key == "const" or (isinstance(values, list) and values), node, key,
            "must be a non-empty list of values")
    others = [k for k in schema if k not in ANNOTATIONS and k not in DEFINITIONS
              and k not in ("type", "enum", "const")]
    if others:
        _refuse(node, others[0], f"is not enforced beside '{key}': list only the values it "
                                 "allows")
    if "enum" in schema and "const" in schema:
        _refuse(node, "const", "is not enforced beside 'enum': give one of them")
    types = _types(schema)
    if types is not None:
        for value in values:
            if not any(_is_of_type(value, t) for t in types):
                _refuse(node, key, f"holds {value!r}, which is not of the schema's type "
                                   f"{schema['type']!r}")


def _check_ref(node: _Node, root: Any) -> None:
    ref = node.schema["$ref"]
    _expect(isinstance(ref, str), node, "$ref", "must be a string")
    if not (ref == "#" or ref.startswith("#/")):
        _refuse(node, "$ref", f"{ref!r} points outside the schema: only references within it "
                              "(#/$defs/name) are supported; put the referenced schema under "
                              "$defs")
    if _resolve(ref, root) is _MISSING:
        _refuse(node, "$ref", f"{ref!r} names nothing in the schema")


def _check_one_of(node: _Node, root: Any) -> None:
    """oneOf asks that exactly one branch match; the grammar enforces any one (anyOf), which
    is the same only when no value can match two branches: branches of distinct types, or
    objects told apart by a required property's constant."""
    branches = [_followed(b, root) for b in node.schema["oneOf"]]
    if _disjoint_by_type(branches) or _disjoint_by_constant(branches) or \
            _disjoint_by_required(branches):
        return
    _refuse(node, "oneOf", "is enforced only when no value can match two of its branches "
                           "(branches of different types, objects with a required property of "
                           "a different const in each, or objects each requiring a property "
                           "the others do not have); use anyOf if any branch may match")


def _disjoint_by_type(branches: list[Any]) -> bool:
    seen: set[str] = set()
    for branch in branches:
        types = _types(branch) if isinstance(branch, dict) else None
        if types is None:
            return False
        widened = types | ({"integer"} if "number" in types else set()) | (
            {"number"} if "integer" in types else set())
        if widened & seen:
            return False
        seen |= widened
    return True


def _disjoint_by_constant(branches: list[Any]) -> bool:
    if not all(isinstance(b, dict) and isinstance(b.get("properties"), dict) for b in branches):
        return False
    shared = set.intersection(*(_required(b) for b in branches))
    for name in sorted(shared):
        constants = [_constant(b["properties"].get(name)) for b in branches]
        if all(c is not _MISSING for c in constants) and len(
                {repr(c) for c in constants}) == len(constants):
            return True
    return False


def _disjoint_by_required(branches: list[Any]) -> bool:
    """Objects whose grammar writes only their own properties (the grammar adds none that are
    not listed, unless additionalProperties or patternProperties allow them): a value made
    for one branch lacks a property each other branch requires."""
    closed = all(isinstance(b, dict) and _types(b) == {"object"}
                 and isinstance(b.get("properties"), dict) and "patternProperties" not in b
                 and b.get("additionalProperties", False) is False for b in branches)
    if not closed:
        return False
    return all(_required(other) - set(branch["properties"])
               for branch in branches for other in branches if other is not branch)


def _constant(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return _MISSING
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    return enum[0] if isinstance(enum, list) and len(enum) == 1 else _MISSING


_MISSING = object()


def _followed(schema: Any, root: Any) -> Any:
    """A branch that is only a $ref, as the schema it refers to."""
    for _ in range(MAX_SCHEMA_DEPTH):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            return schema
        schema = _resolve(schema["$ref"], root)
    return _MISSING


def _resolve(ref: str, root: Any) -> Any:
    if ref == "#":
        return root
    target = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return _MISSING
    return target


def _types(schema: dict) -> set[str] | None:
    """The types the schema names (None when it names none); what is not a type's name is
    left out here and refused by _check_types."""
    given = schema.get("type")
    if given is None:
        return None
    return {t for t in (given if isinstance(given, list) else [given]) if isinstance(t, str)}


def _required(schema: dict) -> set[str]:
    given = schema.get("required")
    return {r for r in given if isinstance(r, str)} if isinstance(given, list) else set()


def _is_of_type(value: Any, name: str) -> bool:
    checks = {"string": lambda v: isinstance(v, str), "integer": _is_int,
              "number": _is_number, "boolean": lambda v: isinstance(v, bool),
              "null": lambda v: v is None, "array": lambda v: isinstance(v, list),
              "object": lambda v: isinstance(v, dict)}
    return checks[name](value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _expect(condition: bool, node: _Node, key: str, problem: str) -> None:
    if not condition:
        _refuse(node, key, problem)


def _refuse(node: _Node, key: str, problem: str) -> None:
    raise StructuredOutputError(f"the JSON schema's keyword '{key}' {problem} (at "
                                f"{_where(node.pointer)})")


def _where(pointer: str) -> str:
    return f"#{pointer}" if pointer else "the root"


def _escaped(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")
