"""The rules on a request's tools and tool_choice (pagoda/engine/requests/tools.py), which
Pagoda's server and the app's backends both follow: each refusal names its field."""

import pytest

from pagoda.engine.errors import PagodaError, RequestFieldError
from pagoda.engine.requests.tools import (
    check_tools,
    forced_on_new_task,
    tool_use,
    tools_constraint,
)

CITY = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}


def function(name: str, parameters: dict | None = None) -> dict:
    definition: dict = {"name": name}
    if parameters is not None:
        definition["parameters"] = parameters
    return {"type": "function", "function": definition}


TOOLS = [function("get_weather", CITY), function("get_time")]


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def refusal(call, *args) -> RequestFieldError:
    with pytest.raises(RequestFieldError) as caught:
        call(*args)
    return caught.value


def test_no_tool_choice_lets_the_model_choose_among_the_tools():
    use = tool_use(TOOLS, None)
    assert (use.mode, use.tools, use.parallel) == ("auto", TOOLS, True)


def test_tool_choice_none_keeps_the_tools_out_of_the_prompt():
    assert tool_use(TOOLS, "none").tools is None


def test_a_named_function_is_the_one_called():
    use = tool_use(TOOLS, named("get_time"), parallel=False)
    assert (use.mode, use.function, use.parallel) == ("named", "get_time", False)


@pytest.mark.parametrize("choice", ["required", "auto", named("anything"), "sometimes"])
def test_tool_choice_without_tools_is_a_chat_without_tools(choice):
    use = tool_use([], choice)
    assert (use.mode, use.tools) == ("none", None)


@pytest.mark.parametrize(("tools", "choice", "field", "words"), [
    (TOOLS, "sometimes", "tool_choice", "'sometimes' is not one of"),
    (TOOLS, {"type": "builtin", "function": {"name": "get_time"}}, "tool_choice.type",
     "only 'function'"),
    (TOOLS, named("get_news"), "tool_choice.function.name",
     "'get_news', which is not among the tools (get_weather, get_time)"),
    ([*TOOLS, {"type": "web_search"}], None, "tools[2].type", "only 'function' tools"),
    ([*TOOLS, function("")], None, "tools[2].function.name", "tools[2] has no name"),
    ([*TOOLS, function("get_time")], None, "tools[2].function.name",
     "tools[1] and tools[2] repeat the name 'get_time'"),
])
def test_tools_and_tool_choice_that_cannot_be_followed_are_refused_naming_the_field(
        tools, choice, field, words):
    error = refusal(tool_use, tools, choice)
    assert error.field == field
    assert words in str(error)


def test_parameters_nested_deeper_than_a_template_reads_are_refused_naming_them():
    parameters: dict = {"type": "string"}
    for _ in range(300):
        parameters = {"type": "array", "items": parameters}
    error = refusal(check_tools, [function("deep", parameters)])
    assert error.field == "tools[0].function.parameters"
    assert "levels deep" in str(error)


def test_a_named_function_holds_the_reply_to_its_parameters():
    field, constraint = tools_constraint(tool_use(TOOLS, named("get_weather")))
    assert field == "tools[0].function.parameters"
    assert constraint.json == CITY


def test_required_holds_the_reply_to_one_call_or_more_of_the_tools():
    field, constraint = tools_constraint(tool_use(TOOLS, "required", parallel=False))
    assert field == "tools"
    assert constraint.json["type"] == "array" and constraint.json["maxItems"] == 1


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_tools_the_model_may_leave_uncalled_put_no_constraint(choice):
    assert tools_constraint(tool_use(TOOLS, choice)) is None


def test_a_parameters_keyword_a_call_could_break_is_refused_naming_its_tool():
    tags = {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
    error = refusal(tools_constraint, tool_use([*TOOLS, function("tags", tags)], "required"))
    assert error.field == "tools[2].function.parameters"
    assert "keyword 'uniqueItems'" in str(error)


@pytest.mark.parametrize(("choice", "field"), [
    ("required", "tools"), (named("wide"), "tools[0].function.parameters")])
def test_parameters_longer_than_a_constraint_may_be_are_refused_in_words(choice, field):
    wide = {"type": "object", "properties": {
        f"field_{i}": {"type": "string", "description": "a field " * 3} for i in range(1200)}}
    error = refusal(tools_constraint, tool_use([function("wide", wide)], choice))
    assert error.field == field
    assert "65,536 characters" in str(error)


def test_a_refusal_is_a_user_error_and_a_value_error():
    error = refusal(tool_use, TOOLS, "sometimes")
    assert isinstance(error, PagodaError) and isinstance(error, ValueError)


USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
ANSWER = {"role": "assistant", "content": "It is sunny."}


@pytest.mark.parametrize("chat", [
    [USER],
    [{"role": "system", "content": "Be brief."}, USER],
    [USER, CALL, RESULT, ANSWER, {"role": "user", "content": "And in Rome?"}],
], ids=["first question", "after a system message", "the next question"])
def test_force_tool_call_turns_auto_into_required_on_a_new_task(chat):
    use = forced_on_new_task(tool_use(TOOLS, "auto", parallel=False), chat)
    assert (use.mode, use.tools, use.parallel) == ("required", TOOLS, False)


@pytest.mark.parametrize("chat", [
    [USER, CALL, RESULT],
    # Anthropic's order: the tool results, then the user's words in the same message.
    [USER, CALL, RESULT, {"role": "user", "content": "Now answer."}],
], ids=["a result came back", "a result and the user's words"])
def test_force_tool_call_lets_the_model_choose_once_a_result_is_back(chat):
    assert forced_on_new_task(tool_use(TOOLS, None), chat).mode == "auto"


@pytest.mark.parametrize("choice", ["none", named("get_time")])
def test_force_tool_call_keeps_the_clients_none_and_named_choice(choice):
    use = tool_use(TOOLS, choice)
    assert forced_on_new_task(use, [USER]) == use
