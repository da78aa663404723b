"""A chat's prompt length guessed without its tokenizer, for servers that cannot count it."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from pagoda.app.backends.types import ChatMessage, TokenCount, ToolSpec

# English runs about four characters a token; other scripts nearer one. The template wraps each
# message in a few tokens of its own, and the generation prompt adds a few more.
_ASCII_CHARS_PER_TOKEN = 4
_TOKENS_PER_MESSAGE = 4
_GENERATION_PROMPT_TOKENS = 3


def estimate_tokens(messages: Sequence[ChatMessage],
                    tools: Sequence[ToolSpec] = ()) -> TokenCount:
    """The guess; the tools count as their JSON definitions, one message's worth of wrapping."""
    total = _GENERATION_PROMPT_TOKENS
    texts = [m.content + "".join(call.name + call.arguments for call in m.tool_calls)
             for m in messages]
    if tools:
        texts.append(json.dumps([tool.as_dict() for tool in tools], ensure_ascii=False))
    for text in texts:
        ascii_chars = sum(1 for ch in text if ch.isascii())
        other_chars = len(text) - ascii_chars
        total += (_TOKENS_PER_MESSAGE + math.ceil(ascii_chars / _ASCII_CHARS_PER_TOKEN)
                  + other_chars)
    return TokenCount(total, exact=False)
