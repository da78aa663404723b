"""Turning chat messages into prompt tokens with the model's own template."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import jinja2

from pagoda.engine.errors import ChatTemplateError
from pagoda.engine.text.template_sandbox import TIME_BUDGET_S, TemplateLimitError, render
from pagoda.engine.text.tool_prompt import hermes_style_chat, needs_hermes_style, template_messages
from pagoda.engine.text.unicode import check_encodable

# {"role", "content"}; an assistant's may add "tool_calls" (OpenAI's list of calls), a tool's
# result "tool_call_id" and "name".
Message = Mapping[str, object]
_ROLES = {"system", "user", "assistant", "tool"}
# Names a template's own variables take; chat_template_kwargs may not replace them.
_TEMPLATE_VARIABLES = {"messages", "tools", "documents", "add_generation_prompt"}


def validate_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise ValueError("messages is empty: give at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be a mapping with 'role' and 'content'")
        if m["role"] not in _ROLES:
            raise ValueError(f"messages[{i}].role={m['role']!r} must be one of {sorted(_ROLES)}")
        if not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}].content must be a string")  # noqa: TRY004
        check_encodable(m["content"], f"messages[{i}].content")
        calls = m.get("tool_calls")
        if calls is not None and (m["role"] != "assistant" or not isinstance(calls, Sequence)):
            raise ValueError(f"messages[{i}].tool_calls must be a list, on an assistant message")


def is_conversation(value: object) -> bool:
    """A list of role/content mappings (as opposed to a list of conversations)."""
    return isinstance(value, Sequence) and bool(value) and isinstance(value[0], Mapping)


def encode_chat(tokenizer, messages: Sequence[Message], *,
                continue_final_message: bool = False, tools: Sequence[Mapping] | None = None,
                template_kwargs: Mapping | None = None,
                expand: Callable[[str], str] | None = None) -> list[int]:
    """Prompt tokens for the assistant's next reply; with `continue_final_message`, the last
    message is the assistant's reply so far and the prompt ends inside it, so generation goes on
    where it stopped (vLLM's parameter of that name). `tools` (OpenAI's function definitions)
    go through the template where it takes them, else into a system message
    (pagoda/engine/text/tool_prompt.py); `template_kwargs` are more variables for the template (say
    Qwen3's enable_thinking). `expand` rewrites the rendered text before it is tokenized (a
    chat's image markers into their placeholders: pagoda.engine.multimodal.placeholders)."""
    validate_messages(messages)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: use generate() with a "
                         "plain prompt instead of chat()")
    chat = template_messages(messages)
    if needs_hermes_style(tokenizer.get_chat_template(), chat, tools):
        chat, tools = hermes_style_chat(chat, tools), None
    partial = ""
    if continue_final_message:
        if chat[-1]["role"] != "assistant" or len(chat) < 2:
            raise ValueError("continue_final_message needs the assistant's reply so far as the "
                             "last message, after the messages it answers")
        partial = chat.pop()["content"]
    # The template's own opening of the assistant's turn, then the reply so far: the same
    # prompt the reply was written after, with its text.
    text = render_chat(tokenizer, chat, add_generation_prompt=True, tools=tools,
                       template_kwargs=template_kwargs)
    if expand is not None:
        text = expand(text)
    return tokenizer.encode(text + partial, add_special_tokens=False)


def render_chat(tokenizer, messages: Sequence[Mapping], *, add_generation_prompt: bool,
                tools: Sequence[Mapping] | None = None, template_kwargs: Mapping | None = None,
                time_budget_s: float = TIME_BUDGET_S) -> str:
    """The text the tokenizer's chat template makes of messages (as transformers'
    apply_chat_template(tokenize=False) makes it), rendered in pagoda.engine.text.template_sandbox under its
    limits. ChatTemplateError, naming the template, for whatever stops it."""
    name = f"the chat template of {getattr(tokenizer, 'name_or_path', '') or 'this model'}"
    taken = sorted(_TEMPLATE_VARIABLES & set(template_kwargs or {}))
    if taken:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(taken)}: the chat "
                         "itself gives them")
    context = {**tokenizer.special_tokens_map, **(template_kwargs or {}),
               "messages": [dict(m) for m in messages],
               "tools": None if tools is None else [dict(t) for t in tools], "documents": None,
               "add_generation_prompt": add_generation_prompt}
    try:
        return render(tokenizer.get_chat_template(), context, time_budget_s)
    except TemplateLimitError as error:
        raise ChatTemplateError(f"{name} was stopped: {error}. A template from a model's files "
                                "may build or run only so much; use a model whose template is "
                                "not built to exhaust the machine.") from error
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(f"{name} is not valid Jinja (line {error.lineno}: {error.message})"
                                ": fix the template in the model's tokenizer_config.json or "
                                "choose another model.") from error
    except jinja2.TemplateError as error:
        raise ChatTemplateError(f"{name} refused this chat: {error}") from error
    except (RecursionError, ArithmeticError, LookupError, TypeError, ValueError) as error:
        raise ChatTemplateError(f"{name} failed on this chat ({type(error).__name__}: {error})"
                                ) from error
