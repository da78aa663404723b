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


def encode_chat(tokenizer, messages: Sequence[Message]) -> list[int]:
    """Prompt tokens for the assistant's next reply."""
    validate_messages(messages)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: use generate() with a "
                         "plain prompt instead of chat()")
    text = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)
