"""At most one constraint shapes a reply (pagoda/engine/requests/constraints.py): of the
request's own fields, or a forced call's; a second is refused naming it."""

import pytest

from pagoda.engine.errors import RequestFieldError
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.requests.constraints import check_one_constraint, one_constraint

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]


def test_no_constraint_given_is_none():
    assert one_constraint([]) is None


def test_one_constraint_given_is_the_one_followed():
    assert one_constraint(["guided_regex"]) == "guided_regex"


def test_two_constraints_are_refused_naming_the_second():
    with pytest.raises(RequestFieldError, match="response_format and guided_regex both "
                                                "constrain the reply") as caught:
        one_constraint(["response_format", "guided_regex"])
    assert caught.value.field == "guided_regex"


@pytest.mark.parametrize("use", [ToolUse("required", TOOLS),
                                 ToolUse("named", TOOLS, "get_weather")])
def test_a_forced_call_and_a_constraint_of_the_request_are_refused_naming_the_constraint(use):
    with pytest.raises(RequestFieldError, match="both shape the whole reply") as caught:
        check_one_constraint(use, "response_format")
    assert caught.value.field == "response_format"


@pytest.mark.parametrize("use", [ToolUse("none", None), ToolUse("auto", TOOLS)])
def test_a_constraint_goes_with_tools_the_model_may_leave_uncalled(use):
    check_one_constraint(use, "response_format")


def test_a_forced_call_alone_is_one_constraint():
    check_one_constraint(ToolUse("required", TOOLS), None)
