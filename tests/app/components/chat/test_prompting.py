"""What the model sees of a chat: the branch as messages, fitted to the context by the
backend's own count (awaited, so never on the GUI thread), and the chat's sampling settings."""

import asyncio

import pytest

from pagoda.app.backends import ChatMessage, SamplingOptions, TokenCount
from pagoda.app.components.chat.prompting import (
    ContextOverflowError,
    fit_to_context,
    sampling_options,
)
from pagoda.app.store import SamplingSettings


class _Counter:
    """A backend's count_tokens: ten tokens a message; remembers each chat it was asked about."""

    def __init__(self) -> None:
        self.asked: list[list[ChatMessage]] = []

    async def __call__(self, messages: list[ChatMessage]) -> TokenCount:
        self.asked.append(messages)
        return TokenCount(10 * len(messages), exact=True)


CHAT = [ChatMessage("system", "Be brief."), ChatMessage("user", "one"),
        ChatMessage("assistant", "two"), ChatMessage("user", "three")]


def test_a_chat_that_fits_is_counted_once_and_sent_whole():
    count = _Counter()
    fitted = asyncio.run(fit_to_context(CHAT, count, max_model_len=1000, max_tokens=100))
    assert fitted.messages == CHAT and fitted.num_dropped == 0
    assert fitted.prompt_tokens == 40 and fitted.max_tokens == 100
    assert len(count.asked) == 1


def test_the_oldest_turns_are_left_out_but_never_the_system_prompt():
    fitted = asyncio.run(fit_to_context(CHAT, _Counter(), max_model_len=90, max_tokens=200,
                                        min_reply_tokens=64))
    assert fitted.messages == [CHAT[0], CHAT[3]] and fitted.num_dropped == 2
    assert fitted.max_tokens == 70  # what the context has left


def test_a_newest_message_too_long_alone_is_refused():
    with pytest.raises(ContextOverflowError, match="context holds 25"):
        asyncio.run(fit_to_context(CHAT, _Counter(), max_model_len=25, max_tokens=200))


def test_the_chats_settings_become_the_backends_sampling_options():
    settings = SamplingSettings(temperature=0.2, top_p=0.8, top_k=40, min_p=0.05,
                                repetition_penalty=1.2, max_tokens=1024, seed=7)
    assert sampling_options(settings, max_tokens=300) == SamplingOptions(
        temperature=0.2, top_p=0.8, top_k=40, min_p=0.05, repetition_penalty=1.2,
        max_tokens=300, seed=7)
