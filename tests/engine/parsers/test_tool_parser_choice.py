"""The tool parser is chosen by name, or from the syntax the chat template teaches."""

from __future__ import annotations

import pytest

from pagoda.engine.parsers.registry import UnknownToolParserError, tool_parser, tool_parser_for_template

QWEN = ('{%- if tools %}For each function call, return a json object within <tool_call></tool_call>'
        ' XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        '</tool_call>{%- endif %}')
MISTRAL = "{%- if message.tool_calls %}{{- '[TOOL_CALLS]' }}{{- tool_calls|tojson }}{%- endif %}"
LLAMA31 = ("{%- if builtin_tools is defined %}{{- '<|python_tag|>' + tool_call.name }}{%- endif %}"
           "<|eot_id|>")
LLAMA32 = ('Respond in the format {"name": function name, "parameters": dictionary of argument '
           "name and its value}.{%- if message.role == 'ipython' %}<|start_header_id|>ipython"
           "<|end_header_id|>{%- endif %}<|eot_id|>")
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


@pytest.mark.parametrize(("template", "family"), [
    (QWEN, "hermes"), (MISTRAL, "mistral"), (LLAMA31, "llama3_json"), (LLAMA32, "llama3_json"),
])
def test_template_markers_choose_the_family(template, family):
    assert tool_parser_for_template(template).name == family


@pytest.mark.parametrize("template", [CHATML, "<|eot_id|> without tools", '"parameters" alone'])
def test_template_without_a_family_marker_chooses_none(template):
    assert tool_parser_for_template(template) is None


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
def test_parser_is_found_by_its_name(name):
    assert tool_parser(name).name == name


def test_unknown_name_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral") as refused:
        tool_parser("qwen")
    assert isinstance(refused.value, UnknownToolParserError)
    assert "'qwen'" in str(refused.value)
