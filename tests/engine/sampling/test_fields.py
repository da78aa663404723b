"""The sampling fields' table: every value it names is one the engine accepts, and what is
derived from it (SamplingParams, the server's request, the command line) follows it."""

from __future__ import annotations

from dataclasses import fields

import pytest

from pagoda.engine.cli.main import build_parser
from pagoda.engine.sampling.fields import SAMPLING_FIELDS, Bounds, sampling_values
from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.server.protocol import ChatCompletionRequest


@pytest.mark.parametrize("field", SAMPLING_FIELDS, ids=lambda f: f.name)
def test_defaults_neutral_values_and_the_spin_box_range_are_in_bounds(field):
    values = [field.default, field.chat_value, field.spin.low, field.spin.high]
    values += [] if field.neutral is None else [field.neutral]
    assert all(field.problem(field.kind(v)) is None for v in values), values
    assert field.help.endswith(".") and "\n" not in field.help


def test_samplingparams_has_a_field_per_row_first_at_its_default():
    names = [f.name for f in fields(SamplingParams)]
    assert names[:len(SAMPLING_FIELDS)] == [f.name for f in SAMPLING_FIELDS]
    assert sampling_values(SamplingParams()) == {f.name: f.default for f in SAMPLING_FIELDS}


@pytest.mark.parametrize(("bounds", "words"), [
    (Bounds(low=0.0, high=1.0, low_open=True), "in (0, 1]"),
    (Bounds(low=-2.0, high=2.0), "in [-2, 2]"),
    (Bounds(low=0.0, low_open=True), "> 0"),
    (Bounds(low=-1), ">= -1"),
])
def test_bounds_say_their_range_as_an_error_does(bounds, words):
    assert bounds.words() == words


def test_a_value_out_of_bounds_is_refused_naming_its_field_and_what_turns_it_off():
    with pytest.raises(ValueError, match=r"SamplingParams.typical_p=0 is invalid: must be in "
                                         r"\(0, 1\] \(1 turns it off\)"):
        SamplingParams(typical_p=0)


def test_the_server_and_the_command_line_take_every_field():
    ones = {f.name: f.kind(1) for f in SAMPLING_FIELDS}  # a value every field accepts
    request = ChatCompletionRequest.model_validate({"messages": [], **ones})
    assert sampling_values(request.sampling_params(max_tokens=8)) == ones
    flags = [f.flag for f in SAMPLING_FIELDS]
    args = build_parser().parse_args(["generate", *[x for flag in flags for x in (flag, "1")]])
    assert all(getattr(args, f.name) == 1 for f in SAMPLING_FIELDS)
