"""Constraints compiled into grammars over the model's vocabulary, cached by their text.

Compiling a JSON schema takes milliseconds (a large one longer), so the caller compiles before
the request reaches the engine thread: `AsyncEngine` on a thread of its own, `LLM` inline. The
engine thread only advances matchers and fills bitmasks, which take microseconds.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable

import xgrammar as xgr

from engine.errors import StructuredOutputError
from engine.sampling_params import StructuredOutputsParams
from engine.structured_output.vocabulary import Vocabulary

# Compiled grammars kept for reuse (an agent sends the same schema with every request).
CACHE_SIZE = 64
# The most whitespace characters in a row a JSON reply may write: a line break and deep
# indentation fit, but a small model cannot loop on blank lines inside an array until
# max_tokens (greedy SmolLM2 did, on two schemas of the test suite).
MAX_JSON_WHITESPACE = 24


class StructuredOutputCompiler:
    """Compiles constraints against one vocabulary. Thread-safe: one compile at a time."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self._vocabulary = vocabulary
        self._compiler: xgr.GrammarCompiler | None = None
        self._cache: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, constraint: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The compiled grammar; StructuredOutputError naming what is wrong with the constraint
        when it cannot be compiled."""
        key = (constraint.kind, constraint.text())
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
            compiled = self._compile(constraint)
            self._cache[key] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return compiled

    def _compile(self, constraint: StructuredOutputsParams) -> xgr.CompiledGrammar:
        compiler = self._grammar_compiler()
        kind, text = constraint.kind, constraint.text()
        try:
            if kind == "json":
                return compiler.compile_json_schema(_schema_text(text),
                                                    max_whitespace_cnt=MAX_JSON_WHITESPACE)
            if kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}',
                                                    max_whitespace_cnt=MAX_JSON_WHITESPACE)
            if kind == "regex":
                return compiler.compile_regex(text)
            if kind == "choice":
                return compiler.compile_grammar(choice_grammar(constraint.choice or ()))
            return compiler.compile_grammar(text)
        except RuntimeError as exc:
            raise StructuredOutputError(
                f"the {_NAMES[kind]} cannot be compiled: {_reason(exc)}") from exc

    def _grammar_compiler(self) -> xgr.GrammarCompiler:
        if self._compiler is None:
            # One thread: compiles run beside the engine's step, which has the cores.
            self._compiler = xgr.GrammarCompiler(self._vocabulary.info, max_threads=1)
        return self._compiler


_NAMES = {"json": "JSON schema", "json_object": "JSON object constraint",
          "regex": "regular expression", "grammar": "grammar", "choice": "choice"}


def choice_grammar(choices: Iterable[str]) -> str:
    """An EBNF grammar whose sentences are exactly the given strings."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _schema_text(text: str) -> str:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StructuredOutputError(f"the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, (dict, bool)):
        raise StructuredOutputError("the JSON schema must be an object (or true/false), not "
                                    f"{type(schema).__name__}")
    return text


def _reason(exc: RuntimeError) -> str:
    """xgrammar's message without its source location ("[12:00:00] /project/cpp/x.cc:12: ")."""
    message = str(exc).strip()
    head, sep, rest = message.partition(": ")
    if sep and ".cc:" in head:
        return rest.strip()
    return message
