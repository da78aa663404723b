"""Prompts tokenized off the caller's event loop, with a tokenizer of their own.

The engine thread detokenizes with the model's tokenizer all the time; a Hugging Face fast
tokenizer used by two threads at once can fail ("Already borrowed"), and a long chat encoded on an
event loop holds up everything else on it (the app's window, the server's other clients).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from engine.chat_template import encode_chat
from engine.errors import EngineDeadError


class ChatTokenizer:
    """Encodes on one thread of its own with a copy of the tokenizer. Raises EngineDeadError
    once closed.

    The copy is made here, by whoever builds the engine (the app does so on its loading
    thread): copying a fast tokenizer round-trips it through JSON holding the GIL for about
    0.1 s, which on a chat's first message would freeze the window that sent it.
    """

    def __init__(self, tokenizer) -> None:
        self._tokenizer = copy.deepcopy(tokenizer)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-tokenize")

    async def encode_chat(self, messages: Sequence[Mapping[str, str]], *,
                          continue_final_message: bool = False) -> list[int]:
        """The prompt for the assistant's next reply (or, with `continue_final_message`, for
        the rest of the last, unfinished one); ValueError for a chat the template refuses (see
        engine.chat_template)."""
        chat = [dict(m) for m in messages]
        return await self._run(lambda tokenizer: encode_chat(
            tokenizer, chat, continue_final_message=continue_final_message))

    async def encode_text(self, text: str) -> list[int]:
        return await self._run(lambda tokenizer: tokenizer.encode(text))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, work) -> list[int]:
        try:
            future = asyncio.get_running_loop().run_in_executor(self._executor, self._call, work)
        except RuntimeError as exc:  # "cannot schedule new futures after shutdown"
            raise EngineDeadError("the engine was shut down") from exc
        return await future

    def _call(self, work) -> list[int]:
        return work(self._tokenizer)
