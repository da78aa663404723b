"""Chats tokenized for the local engine off the app's event loop thread."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from app.backends.types import ChatMessage
from engine.chat_template import encode_chat


class ChatTokenizer:
    """Turns chats into prompt tokens on a thread of its own, with a copy of the tokenizer made
    there: the engine thread detokenizes with the original meanwhile, and a Hugging Face fast
    tokenizer used by two threads at once can fail ("Already borrowed"). One thread, so the
    copy is never shared either; it is made on first use, so building this costs nothing.
    """

    def __init__(self, tokenizer) -> None:
        self._source = tokenizer
        self._tokenizer = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-tokenize")

    async def encode(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Raises ValueError for a chat the template refuses, RuntimeError once closed."""
        chat = [m.as_dict() for m in messages]
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._encode,
                                                                chat)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _encode(self, chat: list[dict[str, str]]) -> list[int]:
        if self._tokenizer is None:
            self._tokenizer = copy.deepcopy(self._source)
        return encode_chat(self._tokenizer, chat)
