"""JSON text from outside (a client's tool-call arguments, a schema, a model's reply) parsed with
its nesting bounded: `json.loads` recurses once per level, so text nested 100,000 deep would
raise RecursionError (a crash, where the caller expects a ValueError it can answer in words)."""

from __future__ import annotations

import json
import re
from itertools import accumulate

# Deeper than any schema or arguments a person writes; far inside Python's recursion limit,
# which the chat template's own walk over the value shares.
MAX_JSON_DEPTH = 200

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONTooDeepError(ValueError):
    """JSON text nested deeper than MAX_JSON_DEPTH."""


def nesting_depth(text: str) -> int:
    """How deep the text's arrays and objects nest (brackets inside strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(_STEP[c] for c in brackets), default=0)


def value_depth(value: object) -> int:
    """How deep a parsed value's lists and dicts nest, walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def loads(text: str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """json.loads, refusing text nested deeper than `max_depth` with JSONTooDeepError (a
    ValueError) before parsing it; json.JSONDecodeError for text that is not JSON."""
    depth = nesting_depth(text)
    if depth > max_depth:
        raise JSONTooDeepError(f"the JSON nests {depth} levels deep; at most {max_depth} are "
                               "accepted")
    return json.loads(text)
