"""Constraints compile against the model's vocabulary, are cached, and fail in words."""

from __future__ import annotations

import pytest

from engine.errors import StructuredOutputError
from engine.sampling_params import StructuredOutputsParams
from engine.structured_output.compiler import StructuredOutputCompiler
from engine.structured_output.vocabulary import Vocabulary


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
