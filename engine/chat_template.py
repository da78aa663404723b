"""Turning chat messages into prompt tokens with the model's own template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.text import check_encodable

Message = Mapping[str, str]
_ROLES = {"system", "user", "assistant", "tool"}


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


def is_conversation(value: object) -> bool:
    """A list of role/content mappings (as opposed to a list of conversations)."""
    return isinstance(value, Sequence) and bool(value) and isinstance(value[0], Mapping)


def encode_chat(tokenizer, messages: Sequence[Message], *,
                continue_final_message: bool = False) -> list[int]:
    """Prompt tokens for the assistant's next reply; with `continue_final_message`, the last
    message is the assistant's reply so far and the prompt ends inside it, so generation goes on
    where it stopped (vLLM's parameter of that name)."""
    validate_messages(messages)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: use generate() with a "
                         "plain prompt instead of chat()")
    chat = [dict(m) for m in messages]
    partial = ""
    if continue_final_message:
        if chat[-1]["role"] != "assistant" or len(chat) < 2:
            raise ValueError("continue_final_message needs the assistant's reply so far as the "
                             "last message, after the messages it answers")
        partial = chat.pop()["content"]
    # The template's own opening of the assistant's turn, then the reply so far: the same
    # prompt the reply was written after, with its text.
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text + partial, add_special_tokens=False)
