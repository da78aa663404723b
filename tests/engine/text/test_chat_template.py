"""A model's chat template renders as transformers renders it, inside a sandbox that bounds what
it may build and how long it may run; whatever stops it is a ChatTemplateError naming the
template."""

import asyncio
import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import transformers

from pagoda.engine.errors import ChatTemplateError
from pagoda.engine.loading.loader import default_model_file, tokenizer_folder
from pagoda.engine.text.chat_template import encode_chat, render_chat
from pagoda.engine.text.chat_tokenizer import ChatTokenizer

ROOT = Path(__file__).resolve().parents[3]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! 50% off, {braces} & <tags>"},
        {"role": "user", "content": "What is 2 + 2?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TOOL_CHAT = [*CHAT[:2], {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "content": "{\"sky\": \"clear\"}"}, {"role": "user", "content": "And now?"}]

# Written for these tests in the manner of the Llama 3 and Qwen 2.5 templates: header tokens,
# a system message taken out of the loop, tools as JSON, tool calls and tool replies.
LLAMA_STYLE = textwrap.dedent("""\
    {{- bos_token }}
    {%- if messages[0]['role'] == 'system' %}
        {%- set system = messages[0]['content'] | trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {%- set system = "" %}
    {%- endif %}
    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
    {%- if tools is not none %}
        {{- 'You may call these functions:\\n' }}
        {%- for t in tools %}{{- t | tojson(indent=2) + '\\n\\n' }}{%- endfor %}
    {%- endif %}
    {{- system ~ '<|eot_id|>' }}
    {%- for message in messages %}
        {%- if loop.first and message['role'] != 'user' %}
            {{- raise_exception('the first message after the system prompt must be the user\\'s') }}
        {%- endif %}
        {%- if message.tool_calls is defined and message.tool_calls %}
            {%- set call = message.tool_calls | first %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
            {{- '{"name": "' + call.function.name + '", "parameters": ' }}
            {{- call.function.arguments | tojson + '}<|eot_id|>' }}
        {%- elif message.role == 'tool' %}
            {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content | trim }}
            {{- '<|eot_id|>' }}
        {%- else %}
            {{- '<|start_header_id|>%s<|end_header_id|>\\n\\n' % message['role'] }}
            {{- message['content'] | trim + '<|eot_id|>' }}
        {%- endif %}
    {%- endfor %}
    {%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
    {%- endif %}
    """)
QWEN_STYLE = textwrap.dedent("""\
    {%- set ns = namespace(system='You are a helpful assistant.', turns=0) %}
    {%- if messages[0].role == 'system' %}{%- set ns.system = messages[0].content %}{%- endif %}
    {{- '<|im_start|>system\\n' + ns.system }}
    {%- if tools %}
        {{- '\\n\\n# Tools\\n<tools>' }}
        {%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
        {{- '\\n</tools>' }}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
    {%- for message in messages if message.role != 'system' %}
        {%- set ns.turns = ns.turns + 1 %}
        {%- if message.role == 'assistant' and message.tool_calls %}
            {{- '<|im_start|>assistant' }}
            {%- for tool_call in message.tool_calls %}
                {{- '\\n<tool_call>\\n{"name": "' ~ tool_call.function.name ~ '", "arguments": ' }}
                {{- tool_call.function.arguments | tojson ~ '}\\n</tool_call>' }}
            {%- endfor %}
            {{- '<|im_end|>\\n' }}
        {%- elif message.role == 'tool' %}
            {%- if loop.previtem is defined and loop.previtem.role != 'tool' %}
                {{- '<|im_start|>user' }}
            {%- endif %}
            {{- '\\n<tool_response>\\n' ~ message.content ~ '\\n</tool_response>' }}
            {%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
        {%- else %}
            {% generation %}{{- '<|im_start|>' + message.role + '\\n' + message.content }}
            {%- endgeneration %}{{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endfor %}
    {{- '<!-- %d turns, %s -->' % (ns.turns, messages | map(attribute='role') | join(',')) }}
    {%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
    """)

BOMBS = {
    "a_string_of_a_billion_characters": ("{{ 'x' * 10**9 }}", "1,000,000,000 characters"),
    "two_nested_loops_of_100000": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "CPU time"),
    "nested_loops_over_a_list": (
        ("{% set xs = range(100000) | list %}{% for i in xs %}{% for j in xs %}{% endfor %}"
        "{% endfor %}"), "CPU time"),
    "a_string_doubled_forty_times": (
        ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s }}"), "a join (~)"),
    "a_list_of_one_long_string_joined": (
        "{{ ([('x' * 1000000)] * 100000) | join }}", "join filter"),
    "a_list_of_one_long_string_printed": ("{{ [('x' * 1000000)] * 100000 }}", "output value"),
    "a_captured_block_written_in_a_loop": (
        ("{% set s %}{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}{% endset %}"
        "{{ s | length }}"), "characters of output in all"),
    "a_printf_width": ("{{ '%999999999d' % 1 }}", "%-format"),
    "a_format_width": ("{{ '{:>999999999}'.format(1) }}", "str.format()"),
    "a_center_width": ("{{ 'x' | center(1000000000) }}", "center filter"),
    "a_huge_power": ("{{ 7 ** 10000000 }}", "a power (**)"),
    "a_replace_that_grows": ("{{ ('a' * 100000).replace('a', 'a' * 1000) }}", "str.replace()"),
    "a_range_of_a_billion": ("{{ range(10**9) | length }}", "range()"),
    "a_format_repeating_one_long_value": (
        "{{ ('{0}' * 1000).format('x' * 1000000) }}", "str.format()"),
    "a_namespace_printed_with_its_values": (
        "{% set ns = namespace(xs=[('x' * 1000000)] * 100000) %}{{ ns }}", "output value"),
    "a_recursive_loop_that_never_ends": (
        ("{% for x in range(100000) recursive %}{% if loop.depth < 3 %}"
        "{{ loop(range(100000)) }}{% endif %}{% endfor %}"), "CPU time"),
    "a_sum_of_lists": ("{{ ([range(1000) | list] * 100000) | sum(start=[]) | length }}",
                       "sum filter"),
}

# Renders each bomb as the engine does, in a process with a memory ceiling and a short CPU
# budget, and tells what stopped it: a regression fails this test, not the machine.
PROBE = textwrap.dedent("""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    import transformers
    from pagoda.engine.text.chat_template import render_chat
    from pagoda.engine.loading.loader import default_model_file, tokenizer_folder
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder(default_model_file()))
    results = {}
    for name, template in json.loads(sys.argv[1]).items():
        tokenizer.chat_template = template
        start = time.monotonic()
        try:
            render_chat(tokenizer, [{"role": "user", "content": "Hi"}],
                        add_generation_prompt=True, time_budget_s=0.5)
            outcome = ["rendered", ""]
        except BaseException as error:
            outcome = [type(error).__name__, str(error)]
        results[name] = [*outcome, time.monotonic() - start]
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(tokenizer_folder(default_model_file()))


@pytest.fixture
def with_template(tokenizer):
    original = tokenizer.chat_template

    def use(template: str):
        tokenizer.chat_template = template
        return tokenizer

    yield use
    tokenizer.chat_template = original


@pytest.fixture(scope="module")
def stopped() -> dict[str, list]:
    templates = {name: template for name, (template, _) in BOMBS.items()}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(templates)], check=False,
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


# Real templates render as transformers renders them


def test_the_default_models_template_renders_as_transformers_renders_it(tokenizer):
    expected = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert render_chat(tokenizer, CHAT, add_generation_prompt=True) == expected
    assert encode_chat(tokenizer, CHAT) == tokenizer.encode(expected, add_special_tokens=False)


@pytest.mark.parametrize("template", [LLAMA_STYLE, QWEN_STYLE], ids=["llama_3", "qwen_2_5"])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no_tools", "tools"])
@pytest.mark.parametrize("chat", [CHAT, TOOL_CHAT], ids=["chat", "tool_calls"])
def test_real_templates_render_as_transformers_renders_them(with_template, template, tools, chat):
    tokenizer = with_template(template)
    for prompt in (True, False):
        expected = tokenizer.apply_chat_template(chat, tools=tools, tokenize=False,
                                                 add_generation_prompt=prompt)
        assert render_chat(tokenizer, chat, tools=tools, add_generation_prompt=prompt) == expected


def test_a_long_chat_renders_as_transformers_renders_it(with_template):
    tokenizer = with_template(QWEN_STYLE)
    chat = [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} " * 50}
            for i in range(1000)]
    expected = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert render_chat(tokenizer, chat, add_generation_prompt=True) == expected


# Limits


@pytest.mark.parametrize("case", BOMBS)
def test_a_template_past_a_limit_is_stopped_with_our_error_naming_the_limit(stopped, case):
    kind, message, seconds = stopped[case]
    assert kind == "ChatTemplateError", message
    assert "the chat template of" in message and BOMBS[case][1] in message
    assert seconds < 30


# Errors are ours, not jinja2's


@pytest.mark.parametrize(("template", "words"), [
    ("{% if %}", "is not valid Jinja (line 1"),
    ("{{ missing.attribute }}", "'missing' is undefined"),
    ("{{ raise_exception('Conversation roles must alternate') }}",
     "refused this chat: Conversation roles must alternate"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
], ids=["syntax", "undefined", "raise_exception", "recursion", "zero_division"])
def test_a_broken_template_is_a_chat_template_error_naming_the_template(with_template, template,
                                                                         words):
    tokenizer = with_template(template)
    with pytest.raises(ChatTemplateError, match="the chat template of") as error:
        encode_chat(tokenizer, CHAT)
    assert words in str(error.value)
    assert isinstance(error.value, ValueError)  # the server answers 400, as for other bad chats


@pytest.mark.parametrize("escape", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "{{ messages.append(1) }}{{ messages }}",
    "{{ dict.__call__.__globals__ }}",
], ids=["class", "cycler", "joiner", "namespace", "namespace_dunder", "mutation", "dict"])
def test_the_sandbox_holds_against_escapes(with_template, escape):
    tokenizer = with_template(escape)
    with pytest.raises(ChatTemplateError, match="unsafe|underscore|may not"):
        render_chat(tokenizer, CHAT, add_generation_prompt=True)


def test_the_shared_tokenizer_thread_refuses_a_bomb_and_serves_the_next_chat(tokenizer):
    bomb = copy.deepcopy(tokenizer)
    bomb.chat_template = BOMBS["a_string_of_a_billion_characters"][0]
    chats = ChatTokenizer(bomb)

    async def twice():
        with pytest.raises(ChatTemplateError, match="1,000,000,000 characters"):
            await chats.encode_chat(CHAT)
        return await chats.encode_text("still here")

    try:
        assert asyncio.run(twice()) == tokenizer.encode("still here")
    finally:
        chats.close()
