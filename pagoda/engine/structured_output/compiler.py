"""Constraints compiled into grammars over the model's vocabulary, cached by their text.

Compiling a JSON schema takes milliseconds, but a short regular expression can take minutes
(see pagoda/engine/structured_output/workers.py), so the caller compiles before the request reaches
the engine thread: `AsyncEngine` in child processes, with a deadline; `LLM` inline. The engine
thread only advances matchers and fills bitmasks, which take microseconds.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator

import xgrammar as xgr

from pagoda.engine.errors import StructuredOutputError
from pagoda.engine.sampling.params import StructuredOutputsParams
from pagoda.engine.structured_output.json_schema import check_schema
from pagoda.engine.structured_output.vocabulary import Vocabulary
from pagoda.engine.text import bounded_json

# Compiled grammars kept for reuse (an agent sends the same schema with every request).
CACHE_SIZE = 64
# The most whitespace characters in a row a JSON reply may write: a line break and deep
# indentation fit, but a small model cannot loop on blank lines inside an array until
# max_tokens (greedy SmolLM2 did, on two schemas of the test suite).
MAX_JSON_WHITESPACE = 24


class StructuredOutputCompiler:
    """Compiles constraints against one vocabulary and keeps the compiled grammars. Thread-safe:
    one compile at a time here (`compile`); `AsyncEngine` compiles in child processes
    (pagoda/engine/structured_output/workers.py) and keeps what they made here (`keep`)."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self._vocabulary = vocabulary
        self._compiler: xgr.GrammarCompiler | None = None
        self._cache: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._compile_lock = threading.Lock()

    @property
    def vocabulary(self) -> Vocabulary:
        return self._vocabulary

    def cached(self, constraint: StructuredOutputsParams) -> xgr.CompiledGrammar | None:
        """The constraint's grammar when it was compiled lately, else None."""
        key = (constraint.kind, constraint.text())
        with self._cache_lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
            return cached

    def keep(self, constraint: StructuredOutputsParams, compiled: xgr.CompiledGrammar) -> None:
        """Remember a grammar compiled elsewhere for the constraint."""
        with self._cache_lock:
            self._cache[(constraint.kind, constraint.text())] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)

    def compile(self, constraint: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The compiled grammar, compiled on this thread when it is not cached;
        StructuredOutputError naming what is wrong with the constraint when it cannot be."""
        cached = self.cached(constraint)
        if cached is not None:
            return cached
        kind, text = grammar_source(constraint)
        with self._compile_lock:
            compiled = compile_source(self._grammar_compiler(), kind, text)
        self.keep(constraint, compiled)
        return compiled

    def _grammar_compiler(self) -> xgr.GrammarCompiler:
        if self._compiler is None:
            self._compiler = grammar_compiler(self._vocabulary.info)
        return self._compiler


def grammar_compiler(info: xgr.TokenizerInfo) -> xgr.GrammarCompiler:
    # One thread: compiles run beside the engine's step, which has the cores. No cache of
    # xgrammar's own: StructuredOutputCompiler keeps the grammars.
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def grammar_source(constraint: StructuredOutputsParams) -> tuple[str, str]:
    """(kind, text) of what xgrammar compiles for the constraint, checked first:
    StructuredOutputError for a schema that is not JSON, or uses a keyword the grammar would not
    hold the reply to (pagoda/engine/structured_output/json_schema.py)."""
    if constraint.kind == "json":
        return "json", _schema_text(constraint.json)
    if constraint.kind == "choice":
        return "choice", choice_grammar(constraint.choice or ())
    if constraint.kind == "structural_tag":
        return "structural_tag", _structural_tag_text(constraint.structural_tag or "")
    return constraint.kind, constraint.text()


def compile_source(compiler: xgr.GrammarCompiler, kind: str, text: str) -> xgr.CompiledGrammar:
    """What `grammar_source` gave, compiled; StructuredOutputError with xgrammar's reason."""
    try:
        if kind == "json":
            return compiler.compile_json_schema(text, max_whitespace_cnt=MAX_JSON_WHITESPACE)
        if kind == "json_object":
            return compiler.compile_json_schema('{"type": "object"}',
                                                max_whitespace_cnt=MAX_JSON_WHITESPACE)
        if kind == "regex":
            return compiler.compile_regex(text)
        if kind == "structural_tag":
            return compiler.compile_structural_tag(text)
        return compiler.compile_grammar(text)
    except (RuntimeError, ValueError) as exc:  # ValueError: a structural tag of the wrong shape
        raise StructuredOutputError(
            f"the {NAMES[kind]} cannot be compiled: {_reason(exc)}") from exc


NAMES = {"json": "JSON schema", "json_object": "JSON object constraint",
         "regex": "regular expression", "grammar": "grammar", "choice": "choice",
         "structural_tag": "structural tag"}


def choice_grammar(choices: Iterable[str]) -> str:
    """An EBNF grammar whose sentences are exactly the given strings."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _schema_text(schema: dict | str | None) -> str:
    if isinstance(schema, str):
        try:
            schema = bounded_json.loads(schema)
        except ValueError as exc:
            raise StructuredOutputError(f"the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, (dict, bool)):
        raise StructuredOutputError("the JSON schema must be an object (or true/false), not "
                                    f"{type(schema).__name__}")
    check_schema(schema)
    return json.dumps(schema, ensure_ascii=False)


def _structural_tag_text(text: str) -> str:
    """The structural tag with each JSON schema in it checked as a `json` constraint's is, and
    its whitespace bounded the same way."""
    try:
        tag = bounded_json.loads(text)
    except ValueError as exc:
        raise StructuredOutputError(f"the structural tag is not valid JSON: {exc}") from exc
    for part in _formats(tag):
        if part.get("type") == "json_schema":
            part["json_schema"] = json.loads(_schema_text(part.get("json_schema")))
            part.setdefault("max_whitespace_cnt", MAX_JSON_WHITESPACE)
    return json.dumps(tag, ensure_ascii=False)


def _formats(value: object) -> Iterator[dict]:
    """Every object in a structural tag but the JSON schemas' insides."""
    if isinstance(value, list):
        for item in value:
            yield from _formats(item)
    elif isinstance(value, dict):
        yield value
        for key, item in list(value.items()):
            if not (key == "json_schema" and value.get("type") == "json_schema"):
                yield from _formats(item)


def _reason(exc: RuntimeError | ValueError) -> str:
    """xgrammar's message without its source location ("[12:00:00] /project/cpp/x.cc:12: "),
    never empty (xgrammar raises some errors, such as a bound of 1e400, with no message)."""
    message = str(exc).strip()
    head, sep, rest = message.partition(": ")
    if sep and ".cc:" in head:
        message = rest.strip()
    if message.endswith("but got"):  # the parser met the end of its input
        message += " the end of the text"
    return message or ("xgrammar refused it without giving a reason (look for a value out of "
                       "range, such as an infinite number)")
