"""Replies in each family's shape, written by hand after real outputs, with what they hold:
(text, content, [(name, arguments)]). Shared by the tests of parsing and of streaming."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Recorded:
    text: str
    content: str | None
    calls: list[tuple[str, str]]


PARIS = '{"city": "Paris", "unit": "celsius"}'
TOKYO = '{"city": "T\u014dky\u014d", "unit": "celsius"}'
EVENT = ('{"title": "Team sync", "attendees": [{"email": "ana@example.org", "optional": false},'
         ' {"email": "li@example.org", "optional": true}], "when": {"start": '
         '"2024-06-03T10:00:00+02:00", "minutes": 30, "repeat": null}}')
# A string holding a closing brace, quotes, backslashes and the closing tag itself.
TRICKY = (r'{"path": "C:\\temp\\out.txt", "code": "if (x) { return \"}\"; } // </tool_call>",'
          r' "note": "ends with a backslash \\"}')
UNICODE = r'{"text": "北京欢迎你 🎉 caf\u00e9", "target": "fr"}'

HERMES = {
    "qwen2.5_two_calls_after_text": Recorded(
        "I'll look up the weather in both cities.\n"
        f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>\n'
        f'<tool_call>\n{{"name": "get_weather", "arguments": {TOKYO}}}\n</tool_call>',
        "I'll look up the weather in both cities.\n\n",
        [("get_weather", PARIS), ("get_weather", TOKYO)]),
    "qwen3_call_only": Recorded(
        f'<tool_call>\n{{"name": "create_event", "arguments": {EVENT}}}\n</tool_call>',
        None, [("create_event", EVENT)]),
    "strings_with_braces_quotes_and_the_closing_tag": Recorded(
        f'<tool_call>\n{{"name": "write_file", "arguments": {TRICKY}}}\n</tool_call>',
        None, [("write_file", TRICKY)]),
    "unicode_arguments": Recorded(
        f'Je traduis.\n<tool_call>\n{{"name": "translate", "arguments": {UNICODE}}}\n'
        '</tool_call>\n',
        "Je traduis.\n\n", [("translate", UNICODE)]),
    "arguments_written_as_a_json_string": Recorded(
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n'
        '</tool_call>',
        None, [("get_weather", '{"city": "Paris"}')]),
    "no_arguments": Recorded(
        '<tool_call>\n{"name": "get_time"}\n</tool_call>', None, [("get_time", "{}")]),
    "plain_answer_mentioning_tags_loosely": Recorded(
        "Use <tool and </tool_ markers < like this.", "Use <tool and </tool_ markers < like this.",
        []),
    "call_whose_closing_tag_never_came": Recorded(
        f'<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n',
        None, [("get_weather", PARIS)]),
}

LLAMA3 = {
    "llama3.2_bare_json": Recorded(
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        None, [("get_weather", '{"city": "Paris"}')]),
    "llama3.1_python_tag": Recorded(
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        None, [("get_weather", '{"city": "Paris"}')]),
    "two_calls_joined_by_semicolon": Recorded(
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}',
        None, [("get_weather", '{"city": "Paris"}'),
               ("get_time", '{"timezone": "Europe/Paris"}')]),
    "arguments_key_and_nested_values": Recorded(
        f' {{"name": "create_event", "arguments": {EVENT}}}', None, [("create_event", EVENT)]),
    "parameters_as_a_json_string": Recorded(
        '{"name": "get_weather", "parameters": "{\\"city\\": \\"Paris\\"}"}',
        None, [("get_weather", '{"city": "Paris"}')]),
    "plain_answer": Recorded(
        "The weather in Paris is sunny, 24 °C.", "The weather in Paris is sunny, 24 °C.", []),
    "plain_answer_that_later_shows_json": Recorded(
        'Here it is: {"name": "x", "parameters": {}}', 'Here it is: {"name": "x", "parameters": {}}',
        []),
    "json_answer_that_is_no_call": Recorded(
        '{"city": "Paris", "population": 2102650}', '{"city": "Paris", "population": 2102650}',
        []),
}

MISTRAL = {
    "array_of_two_calls": Recorded(
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_weather", "arguments": {"city": "Lyon"}}]',
        None, [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Lyon"}')]),
    "array_with_ids_and_tricky_strings": Recorded(
        f'[TOOL_CALLS] [{{"name": "write_file", "arguments": {TRICKY}, "id": "a1B2c3D4e"}}]',
        None, [("write_file", TRICKY)]),
    "name_and_args_form": Recorded(
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        None, [("get_weather", '{"city": "Paris"}')]),
    "name_and_args_form_twice_after_text": Recorded(
        f'Let me check both.[TOOL_CALLS]create_event[ARGS]{EVENT}'
        f'[TOOL_CALLS]translate[ARGS]{UNICODE}',
        "Let me check both.", [("create_event", EVENT), ("translate", UNICODE)]),
    "plain_answer_with_brackets": Recorded(
        "Lists look like [1, 2] and [TOOL] is no tag.",
        "Lists look like [1, 2] and [TOOL] is no tag.", []),
}

BY_FAMILY = {"hermes": HERMES, "llama3_json": LLAMA3, "mistral": MISTRAL}

ALL = [(family, name, recorded) for family, replies in BY_FAMILY.items()
       for name, recorded in replies.items()]
