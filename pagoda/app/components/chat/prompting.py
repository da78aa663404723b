"""From a conversation's branch to what the model sees: messages, context fitting, sampling."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from pagoda.app.backends import (
    ChatMessage,
    SamplingOptions,
    TokenCount,
    ToolSpec,
    sampling_values,
)
from pagoda.app.components.chat.tool_turns import answered_calls, call_outcomes
from pagoda.app.components.images.stored_images import to_chat_image
from pagoda.app.store import GenerationStats, Message, SamplingSettings

TokenCounter = Callable[[list[ChatMessage]], Awaitable[TokenCount]]


class ContextOverflowError(ValueError):
    """The newest message alone does not fit the model's context."""


@dataclass(slots=True, frozen=True)
class FittedPrompt:
    """The messages sent to the model, how many old ones were left out, and the reply budget."""

    messages: list[ChatMessage]
    num_dropped: int
    prompt_tokens: int
    max_tokens: int
    exact: bool = True  # prompt_tokens was counted by the model's tokenizer, not estimated


def chat_messages(system_prompt: str | None, path: Sequence[Message]) -> list[ChatMessage]:
    """The branch as the model is given it: what the user saw (a user's images with their
    message), partial replies included, an
    assistant's reasoning beside its answer (the template decides what it keeps), its answered
    calls and their results."""
    messages = [ChatMessage("system", system_prompt)] if system_prompt else []
    answered = call_outcomes(path)
    for m in path:
        if m.role == "tool":
            messages.append(ChatMessage("tool", m.content, tool_call_id=m.tool_call_id))
            continue
        if m.role != "assistant":
            images = tuple(to_chat_image(kept) for kept in m.images)
            messages.append(ChatMessage(m.role, m.content, images=images))
            continue
        calls = answered_calls(m, answered)
        if m.content or calls:  # else a reply that failed before its first token, or the new one
            messages.append(ChatMessage("assistant", m.content, tool_calls=calls,
                                        reasoning=m.reasoning))
    return messages


async def fit_to_context(messages: list[ChatMessage], count_tokens: TokenCounter,
                         max_model_len: int, max_tokens: int,
                         min_reply_tokens: int = 64) -> FittedPrompt:
    """Leave out the oldest turns (never the system prompt or the newest message) until the prompt
    and at least `min_reply_tokens` of reply fit; the reply budget is what remains, up to
    max_tokens. A chat that fits is counted once. Nothing is truncated silently: the caller
    tells the user `num_dropped`.
    """
    head = 1 if messages and messages[0].role == "system" else 0
    dropped = 0
    while True:
        while head + dropped < len(messages) - 1 and messages[head + dropped].role == "tool":
            dropped += 1  # a result whose call was left out goes with it
        kept = messages[:head] + messages[head + dropped:]
        count = await count_tokens(kept)
        prompt_tokens = count.n
        room = max_model_len - prompt_tokens
        if room >= min(min_reply_tokens, max_tokens):
            return FittedPrompt(kept, dropped, prompt_tokens, min(max_tokens, room), count.exact)
        if len(kept) - head <= 1:
            raise ContextOverflowError(
                f"The message is {prompt_tokens} tokens long with the system prompt, and the "
                f"model's context holds {max_model_len}: shorten it or start a new chat.")
        dropped += 1


def sampling_options(settings: SamplingSettings, max_tokens: int, *,
                     tools: tuple[ToolSpec, ...] = (),
                     thinking_switch: bool = False) -> SamplingOptions:
    """The reply's options; the chat's thinking switch only where the model has one (the
    settings say so where it has not)."""
    return SamplingOptions(
        **sampling_values(settings),
        max_tokens=max_tokens,
        seed=settings.seed,
        tools=tools,
        enable_thinking=settings.enable_thinking if thinking_switch else None,
    )


def stats_text(stats: GenerationStats | None, completion_tokens: int | None = None) -> str:
    """One line under a reply: speed, time to first token, reused prefix."""
    if stats is None:
        return ""
    parts = []
    if stats.tokens_per_s is not None:
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
    if completion_tokens:
        parts.append(f"{completion_tokens} tokens")
    if stats.ttft_s is not None:
        parts.append(f"TTFT {stats.ttft_s:.2f} s")
    if stats.cached_tokens:
        parts.append(f"{stats.cached_tokens} cached")
    if stats.model:
        parts.append(stats.model)
    return " · ".join(parts)
