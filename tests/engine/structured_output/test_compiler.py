"""Constraints compile against the model's vocabulary, are cached, and fail in words."""

from __future__ import annotations

import pytest
import xgrammar as xgr

from pagoda.engine.errors import StructuredOutputError
from pagoda.engine.sampling.params import StructuredOutputsParams
from pagoda.engine.structured_output.compiler import StructuredOutputCompiler
from pagoda.engine.structured_output.vocabulary import Vocabulary


@pytest.fixture(scope="module")
def compiler(default_model) -> StructuredOutputCompiler:
    vocab_size = default_model.config.vocab_size
    return StructuredOutputCompiler(Vocabulary(default_model.tokenizer, vocab_size, [2]))


def test_the_same_constraint_compiles_once(compiler):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    first = compiler.compile(StructuredOutputsParams(json=schema))
    assert compiler.compile(StructuredOutputsParams(json=dict(schema))) is first
    assert compiler.compile(StructuredOutputsParams(regex="[a-z]+")) is not first


@pytest.mark.parametrize(("constraint", "words"), [
    (StructuredOutputsParams(json='{"type": "nonsense"}'), ["JSON schema", "nonsense"]),
    (StructuredOutputsParams(json="{not json"), ["JSON schema", "not valid JSON"]),
    (StructuredOutputsParams(json="[1, 2]"), ["JSON schema", "must be an object"]),
    (StructuredOutputsParams(regex="(unclosed"), ["regular expression", "parenthesis"]),
    (StructuredOutputsParams(grammar="root ::= "), ["grammar", "line 1"]),
])
def test_a_constraint_that_cannot_compile_names_the_problem(compiler, constraint, words):
    with pytest.raises(StructuredOutputError) as caught:
        compiler.compile(constraint)
    message = str(caught.value)
    assert all(word in message for word in words), message
    assert ".cc:" not in message  # xgrammar's source location is not the user's business


def test_exactly_one_constraint_is_taken():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()


def test_a_constraint_over_the_size_bound_is_refused_before_compiling():
    with pytest.raises(ValueError, match="at most 65536 characters"):
        StructuredOutputsParams(grammar='root ::= "' + "a" * 70000 + '"')


def _follows(compiled, text: str) -> bool:
    """Whether the grammar lets a reply write `text` and then stop (token 2 stops)."""
    matcher = xgr.GrammarMatcher(compiled)
    return matcher.accept_string(text) and matcher.accept_token(2)


@pytest.mark.parametrize(("schema", "fits", "breaks"), [
    ({"type": "integer", "minimum": 5}, "5", "4"),
    ({"type": "number", "exclusiveMaximum": 5}, "4.5", "5"),
    ({"type": "integer", "multipleOf": 7}, "14", "155555"),
    ({"type": "string", "maxLength": 3}, '"abc"', '"abcd"'),
    ({"type": "string", "pattern": "^a+$"}, '"aa"', '"ab"'),
    ({"type": "string", "format": "email"}, '"a@b.co"', '"not an email"'),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 1}, "[1]", "[1,2]"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
     '{"a": 1}', "{}"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False},
     '{"a": 1}', '{"b": 1}'),
    ({"type": "object", "additionalProperties": True, "maxProperties": 1}, '{"a": 1}',
     '{"a": 1, "b": 2}'),
    ({"type": ["integer", "null"], "minimum": 0}, "null", "-1"),
    ({"type": "string", "enum": ["x", "y"]}, '"x"', '"z"'),
    ({"oneOf": [{"type": "object", "properties": {"circle": {"type": "number"}},
                 "required": ["circle"]},
                {"type": "object", "properties": {"square": {"type": "number"}},
                 "required": ["square"]}]}, '{"circle": 1}', '{"circle": 1, "square": 2}'),
    ({"$defs": {"n": {"type": "integer", "maximum": 3}}, "$ref": "#/$defs/n"}, "3", "4"),
])
def test_the_keywords_that_are_accepted_are_enforced(compiler, schema, fits, breaks):
    compiled = compiler.compile(StructuredOutputsParams(json=schema))
    assert _follows(compiled, fits)
    assert not _follows(compiled, breaks)


@pytest.mark.parametrize("constraint", [
    # xgrammar raises this one with an empty message.
    StructuredOutputsParams(json={"type": "integer", "minimum": 10 ** 400}),
    StructuredOutputsParams(json={"type": "integer", "maximum": 5, "minimum": 6}),
    StructuredOutputsParams(regex="(?=a)"),
    # xgrammar's reason ends "but got " (the end of the text, which it does not name).
    StructuredOutputsParams(grammar="root ::= ("),
])
def test_every_compile_error_gives_a_reason(compiler, constraint):
    with pytest.raises(StructuredOutputError) as caught:
        compiler.compile(constraint)
    reason = str(caught.value).partition("cannot be compiled: ")[2]
    assert reason.strip() and not reason.endswith("but got"), str(caught.value)
