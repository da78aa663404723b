"""Prompts tokenized off the caller's event loop, with tokenizers of their own.

The engine thread detokenizes with the model's tokenizer all the time; a Hugging Face fast
tokenizer used by two threads at once can fail ("Already borrowed"), and a long chat encoded on an
event loop holds up everything else on it (the app's window, the server's other clients).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from pagoda.engine.errors import EngineDeadError, PromptTooLongError
from pagoda.engine.text.chat_template import encode_chat
from pagoda.engine.text.unicode import check_encodable

# A text longer than this goes to the lane for long texts (tens of milliseconds and more to
# encode), so a short chat never waits behind a long one.
LONG_TEXT_CHARS = 8192

Work = Callable[[object], list[int]]


def longest_token_chars(tokenizer) -> int:
    """An upper bound on the characters of text one token stands for: its longest vocabulary
    entry (a byte-level entry spells each byte as one character, and a character is at least
    one byte)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1) or 1


class _Lane:
    """One thread with a tokenizer copy of its own: a fast tokenizer is not safe to share."""

    def __init__(self, tokenizer, name: str) -> None:
        self.tokenizer = copy.deepcopy(tokenizer)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)


class ChatTokenizer:
    """Encodes on two threads of its own, each with a copy of the tokenizer: one for short
    texts and one for long ones (over LONG_TEXT_CHARS characters). Raises EngineDeadError once
    closed.

    With `max_tokens` (the model's context), a text of more characters than that many tokens
    could spell is refused with PromptTooLongError before it is tokenized: a prompt of megabytes
    would otherwise hold a thread (and memory) for seconds only to be refused.

    The copies are made here, by whoever builds the engine (the app does so on its loading
    thread): copying a fast tokenizer round-trips it through JSON holding the GIL for about
    0.1 s, which on a chat's first message would freeze the window that sent it.
    """

    def __init__(self, tokenizer, max_tokens: int | None = None) -> None:
        self._short = _Lane(tokenizer, "pagoda-tokenize")
        self._long = _Lane(tokenizer, "pagoda-tokenize-long")
        self._max_tokens = max_tokens
        self._chars_per_token = None if max_tokens is None else longest_token_chars(tokenizer)

    @property
    def max_chars(self) -> int | None:
        """The most characters a prompt may have before it is refused untokenized."""
        if self._max_tokens is None:
            return None
        return self._max_tokens * self._chars_per_token

    async def encode_chat(self, messages: Sequence[Mapping[str, object]], *,
                          continue_final_message: bool = False,
                          tools: Sequence[Mapping] | None = None,
                          template_kwargs: Mapping | None = None,
                          expand: Callable[[str], str] | None = None) -> list[int]:
        """The prompt for the assistant's next reply (or, with `continue_final_message`, for
        the rest of the last, unfinished one), with `tools`, `template_kwargs` and `expand`
        as pagoda.engine.text.chat_template.encode_chat takes them; ValueError for a chat the
        template refuses, PromptTooLongError for one far over the context (tools counted)."""
        chat = [dict(m) for m in messages]
        chars = sum(len(m["content"]) for m in chat if isinstance(m.get("content"), str))
        chars += sum(len(json.dumps(m["tool_calls"])) for m in chat if m.get("tool_calls"))
        chars += len(json.dumps(list(tools))) if tools else 0
        self._check_size(chars, "the chat's messages")
        return await self._run(chars, lambda tokenizer: encode_chat(
            tokenizer, chat, continue_final_message=continue_final_message, tools=tools,
            template_kwargs=template_kwargs, expand=expand))

    async def encode_text(self, text: str, what: str = "the prompt") -> list[int]:
        """The text's tokens (special tokens added as the tokenizer does); InvalidTextError
        naming `what` for a lone surrogate, PromptTooLongError for a text far over the
        context."""
        check_encodable(text, what)
        self._check_size(len(text), what)
        return await self._run(len(text), lambda tokenizer: tokenizer.encode(text))

    async def decode(self, token_ids: list[int]) -> str:
        """The text of token ids (special tokens spelled out), decoded on a lane's thread;
        ValueError naming the first id outside the vocabulary."""
        size = len(self._short.tokenizer)
        bad = next((t for t in token_ids if not 0 <= t < size), None)
        if bad is not None:
            raise ValueError(f"tokens holds {bad}, outside the vocabulary [0, {size})")
        return await self._run(len(token_ids), lambda tokenizer: tokenizer.decode(token_ids))

    def close(self) -> None:
        for lane in (self._short, self._long):
            lane.executor.shutdown(wait=False, cancel_futures=True)

    def _check_size(self, chars: int, what: str) -> None:
        limit = self.max_chars
        if limit is not None and chars > limit:
            raise PromptTooLongError(
                f"{what} has {chars} characters, more than the model's context of "
                f"{self._max_tokens} tokens can hold (at most {limit} characters: no token of "
                f"this tokenizer is longer than {self._chars_per_token}): shorten it")

    async def _run(self, chars: int, work: Work) -> list[int]:
        lane = self._long if chars > LONG_TEXT_CHARS else self._short
        try:
            future = asyncio.get_running_loop().run_in_executor(
                lane.executor, self._call, work, lane.tokenizer)
        except RuntimeError as exc:  # "cannot schedule new futures after shutdown"
            raise EngineDeadError("the engine was shut down") from exc
        return await future

    def _call(self, work: Work, tokenizer) -> list[int]:
        return work(tokenizer)
