"""Thirty-odd JSON schemas of the kinds clients send: nested objects, bounded arrays, enums,
anyOf, optional keys, string patterns and formats, integers and numbers with ranges; and a
short regular expression that is slow to compile."""

from __future__ import annotations

_STR = {"type": "string"}
_INT = {"type": "integer"}

SCHEMAS: list[dict] = [
    {"type": "object", "properties": {"name": _STR}, "required": ["name"]},
    {"type": "object", "properties": {"name": _STR, "age": _INT}, "required": ["name", "age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["score"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 65}},
     "required": ["age"]},
    {"type": "object", "properties": {"level": {"type": "integer", "exclusiveMinimum": 0,
                                                "exclusiveMaximum": 10}},
     "required": ["level"]},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
     "required": ["colour"]},
    {"type": "object", "properties": {"answer": {"const": "yes"}}, "required": ["answer"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": _STR, "minItems": 1,
                                               "maxItems": 3}},
     "required": ["tags"]},
    {"type": "object", "properties": {"points": {"type": "array", "items": _INT,
                                                 "minItems": 2, "maxItems": 2}},
     "required": ["points"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}},
     "required": ["code"]},
    {"type": "object", "properties": {"word": {"type": "string", "minLength": 2, "maxLength": 8}},
     "required": ["word"]},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"}},
     "required": ["when"]},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}},
     "required": ["id"]},
    {"type": "object", "properties": {"email": {"type": "string", "format": "email"}},
     "required": ["email"]},
    {"type": "object", "properties": {"value": {"anyOf": [_INT, _STR]}}, "required": ["value"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "null"}, _STR]}},
     "required": ["value"]},
    {"type": "object", "properties": {"name": _STR, "nickname": _STR}, "required": ["name"]},
    {"type": "object", "properties": {"a": _INT, "b": _INT, "c": _INT}},
    {"type": "object", "properties": {"address": {
        "type": "object", "properties": {"street": _STR, "city": _STR, "zip": {
            "type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["street", "city", "zip"]}}, "required": ["address"]},
    {"type": "object", "properties": {"people": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"name": _STR, "age": _INT},
        "required": ["name", "age"]}}}, "required": ["people"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "items": _INT, "minItems": 2, "maxItems": 2}}},
     "required": ["matrix"]},
    {"type": "object", "properties": {"meta": {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {"flag": {"type": "boolean"}},
                  "required": ["flag"]}}, "required": ["inner"]}}, "required": ["meta"]},
    {"type": "object", "properties": {"status": {"enum": ["open", "closed"]},
                                      "count": {"type": "integer", "minimum": 0}},
     "required": ["status", "count"]},
    {"type": "object", "properties": {"title": _STR, "year": {
        "type": "integer", "minimum": 1900, "maximum": 2100}, "genres": {
        "type": "array", "items": {"enum": ["drama", "comedy", "horror"]}, "maxItems": 2}},
     "required": ["title", "year", "genres"]},
    {"type": "object", "properties": {"shape": {"oneOf": [
        {"type": "object", "properties": {"circle": {"type": "number"}},
         "required": ["circle"]},
        {"type": "object", "properties": {"square": {"type": "number"}},
         "required": ["square"]}]}}, "required": ["shape"]},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0},
                                      "currency": {"enum": ["EUR", "USD"]}},
     "required": ["price", "currency"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": _STR,
                                                "maxItems": 0}}, "required": ["items"]},
    {"type": "array", "items": _INT, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": {"type": "object", "properties": {"k": _STR},
                                "required": ["k"]}, "maxItems": 2},
    {"type": "string", "enum": ["alpha", "beta"]},
    {"type": "integer", "minimum": -5, "maximum": 5},
    {"$defs": {"pt": {"type": "object", "properties": {"x": _INT, "y": _INT},
                      "required": ["x", "y"]}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"},
                                      "to": {"$ref": "#/$defs/pt"}},
     "required": ["from", "to"]},
    {"type": "object", "properties": {"note": {"type": ["string", "null"]}},
     "required": ["note"]},
]

# 120 characters that take about a minute to compile on one core (issue 51, item 12).
SLOW_REGEX = "".join(f"[^{chr(ord('a') + i)}]{{1,{1000 + i}}}" for i in range(10))
