"""LocalBackend: replies from the engine in this process. The app's tabs reach the engine only
through it (docs/APP.md lists the few files that build or serve the engine)."""

from __future__ import annotations

import functools
import itertools
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace

from pagoda.app.backends.chat.local_request import LocalRequest, local_request
from pagoda.app.backends.chat.reply_parts import NOTHING, ReplyParts, Step
from pagoda.app.backends.chat.starting import StartingReplies
from pagoda.app.backends.errors import (
    BackendStoppedError,
    ImagesRefusedError,
    InvalidRequestError,
    PromptTooLongError,
    ServerError,
    clause,
)
from pagoda.app.backends.types import (
    BackendStats,
    ChatMessage,
    ImageCost,
    ImageInput,
    PromptProgress,
    ReplyChunk,
    SamplingOptions,
    TokenCount,
    ToolSpec,
)
from pagoda.engine import AsyncEngine, EngineDeadError, RequestOutput
from pagoda.engine import PromptTooLongError as EnginePromptTooLongError
from pagoda.engine.errors import ImageInputError, StructuredOutputError
from pagoda.engine.multimodal.images import DecodedImage, decode_image_bytes
from pagoda.engine.multimodal.placeholders import ImagePrompt
from pagoda.engine.outputs import RequestMetrics
from pagoda.engine.parsers.replies import ReplyShape, ReplyStream, reply_shape

# Chats counted and not yet streamed whose tokens are kept: a reply's fitting counts its chat,
# and the stream that follows reuses those tokens instead of tokenizing the chat again.
ENCODED_CHATS_KEPT = 8
# Enough of the prompt's end to see whether it opens the reasoning ("<think>\n").
_PROMPT_TAIL_TOKENS = 8


class LocalBackend:
    """A ChatBackend over an AsyncEngine, which it owns: `shutdown` stops the engine.

    A chat is tokenized off the event loop by the engine's ChatTokenizer (a thread and a
    tokenizer copy of its own) and the engine gets its tokens. A chat counted with
    `count_tokens` (with the same tools) is not tokenized again when it is streamed: once per
    reply.
    The reply is read into reasoning, answer and tool calls by the parsers Pagoda's server
    uses, so its chunks say what a remote Pagoda's would.
    """

    location = "this computer"
    max_model_len_known = True

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self.model_name = engine.model_name
        self.max_model_len = engine.usable_context_len
        self._last_ttft: float | None = None
        self._starting = StartingReplies()
        self._ids = itertools.count()
        self._encoded: OrderedDict[tuple, list[int]] = OrderedDict()

    @property
    def thinking_switch(self) -> bool:
        """Whether the model's chat template reads `enable_thinking`."""
        return "enable_thinking" in (self._engine.chat_template or "")

    @property
    def image_input(self) -> ImageInput:
        """Whether the engine's model sees images (a multimodal Gemma 3, SmolVLM or Qwen2.5-VL
        does) and what one costs: its placeholders, with its markers and any blank lines around
        them (about, where such lines may merge with the text beside them)."""
        prompt = self._engine.image_prompt
        if prompt is None:
            return ImageInput(False, why=f"{self.model_name} on this computer takes text only: "
                                         "it cannot see images (use a server whose model sees "
                                         "them)")
        if prompt.tokens_per_image is not None:  # the same whatever the image's size
            return ImageInput(True, ImageCost(fixed_tokens=prompt.tokens((0, 0))))
        return ImageInput(True, ImageCost(exact=prompt.exact,
                                          counted_by=functools.partial(_image_tokens, prompt)))

    @property
    def engine(self) -> AsyncEngine:
        """The engine behind this backend, for what serves it further (the local API server)."""
        return self._engine

    async def stream(self, messages: Sequence[ChatMessage], options: SamplingOptions,
                     request_id: str | None = None, *, continue_final_message: bool = False,
                     cache_tag: str | None = None) -> AsyncIterator[ReplyChunk]:
        if any(m.images for m in messages) and self._engine.image_prompt is None:
            raise ImagesRefusedError(f"{self.image_input.why}.")
        images = _decoded_images(messages)
        request = local_request(options)
        request_id = request_id or f"local-{next(self._ids)}"
        with self._starting.starting(request_id):
            prompt = await self._prompt(messages, request, continue_final_message)
        if self._starting.was_aborted(request_id):
            yield ReplyChunk("", "", "abort")
            return
        parts = ReplyParts()
        shape = self._shape(request, prompt)
        reading = shape.streamer()
        try:
            async for out in self._engine.stream(prompt, shape.adjusted(request.params),
                                                 request_id, cache_tag, images):
                yield self._chunk(out, reading, parts)
        except EngineDeadError as exc:
            raise _stopped(exc, parts.text) from exc
        except EnginePromptTooLongError as exc:
            raise PromptTooLongError(f"The chat is too long for the model: {clause(exc)}.") from exc
        except StructuredOutputError as exc:
            raise InvalidRequestError(f"The engine cannot follow {request.constrained_by}: "
                                      f"{clause(exc)}.") from exc
        except ValueError as exc:
            raise InvalidRequestError(f"The engine refused the request: {clause(exc)}.") from exc

    def abort(self, request_id: str) -> None:
        self._starting.abort(request_id)
        self._engine.abort(request_id)

    def stats(self) -> BackendStats:
        s = self._engine.stats()
        return BackendStats(num_running=s.num_running, num_waiting=s.num_waiting,
                            kv_cache_usage=s.kv_cache_usage,
                            prefix_cache_hit_rate=s.prefix_cache_hit_rate,
                            tokens_per_s=s.generation_tokens_per_s,
                            time_to_first_token=self._last_ttft,
                            spec_acceptance_rate=s.spec_acceptance_rate,
                            spec_status=s.spec_status, spec_reason=s.spec_reason)

    async def count_tokens(self, messages: Sequence[ChatMessage],
                           tools: Sequence[ToolSpec] = ()) -> TokenCount:
        definitions = [tool.as_dict() for tool in tools] or None
        key = _chat_key(messages, definitions)
        tokens = self._encoded.get(key)
        if tokens is None:
            tokens = await self._encode(messages, tools=definitions)
            self._encoded[key] = tokens
            while len(self._encoded) > ENCODED_CHATS_KEPT:
                self._encoded.popitem(last=False)
        else:
            self._encoded.move_to_end(key)
        return TokenCount(len(tokens), exact=True)

    def shutdown(self) -> None:
        self._engine.shutdown()

    def clear_disk_cache(self) -> bool:
        """Drop the blocks the engine keeps on disk, and those queued for it; False when it keeps
        none (no folder was configured). Any thread."""
        return self._engine.clear_disk_cache()

    def flush_disk_cache(self, timeout: float = 10.0) -> bool:
        """Wait until the blocks the engine has queued for the disk are written, so none comes
        back after its chat's blocks are removed; False when it keeps none. Any thread."""
        return self._engine.flush_disk_cache(timeout)

    async def _prompt(self, messages: Sequence[ChatMessage], request: LocalRequest,
                      continue_final_message: bool) -> list[int]:
        """The chat's tokens: those count_tokens kept, where it was counted as it is sent
        (without tools, not to be continued)."""
        tools = request.use.tools
        template_kwargs = self._template_kwargs(request)
        if continue_final_message or template_kwargs:
            return await self._encode(messages, continue_final_message=continue_final_message,
                                      tools=tools, template_kwargs=template_kwargs)
        counted = self._encoded.pop(_chat_key(messages, tools), None)
        return counted or await self._encode(messages, tools=tools)

    def _template_kwargs(self, request: LocalRequest) -> dict | None:
        """The thinking switch, where the template has one; refused in words where it has not."""
        if request.enable_thinking is None:
            return None
        if not self.thinking_switch:
            raise InvalidRequestError(f"This chat turns thinking {_on_off(request.enable_thinking)}"
                                      f", but {self.model_name}'s chat template has no thinking "
                                      "switch: set Thinking to the model's default.")
        return {"enable_thinking": request.enable_thinking}

    def _shape(self, request: LocalRequest, prompt: list[int]) -> ReplyShape:
        try:
            return reply_shape(self._engine.chat_template, request.use,
                               lambda: self._engine.token_text(prompt[-_PROMPT_TAIL_TOKENS:]))
        except ValueError as exc:
            raise InvalidRequestError(f"This chat's tools cannot be used with this model: "
                                      f"{clause(exc)}.") from exc

    async def _encode(self, messages: Sequence[ChatMessage], *,
                      continue_final_message: bool = False,
                      tools: list[dict] | None = None,
                      template_kwargs: dict | None = None) -> list[int]:
        prompt = self._engine.image_prompt
        with_images = prompt is not None and any(m.images for m in messages)
        try:
            return await self._engine.chat_tokenizer.encode_chat(
                [_template_dict(m, prompt) if with_images else m.template_dict()
                 for m in messages],
                continue_final_message=continue_final_message, tools=tools,
                template_kwargs=template_kwargs,
                expand=_expand(prompt, messages) if with_images else None)
        except EngineDeadError as exc:  # the tokenizer's thread is gone: we were shut down
            raise _stopped(exc, "") from exc
        except ValueError as exc:
            raise InvalidRequestError(f"The chat cannot be given to the model: {clause(exc)}.") from exc

    def _chunk(self, out: RequestOutput, reading: ReplyStream, parts: ReplyParts) -> ReplyChunk:
        completion = out.outputs[0]
        if completion.finish_reason == "error":
            raise ServerError(f"The engine failed this reply: {completion.error}. What arrived "
                              "is kept; regenerate to try again.", partial_text=parts.text)
        if out.prompt_progress is not None:
            read = out.prompt_progress
            return parts.chunk(prompt_progress=PromptProgress(read.num_computed_tokens,
                                                              read.num_prompt_tokens))
        step = parts.add(reading.feed(completion.delta_text)) or NOTHING
        if not out.finished:
            return parts.chunk(step)
        step = _joined(step, parts.add(reading.finish()) or NOTHING)
        m = out.metrics
        num_output = len(completion.token_ids)
        self._last_ttft = m.time_to_first_token
        return parts.chunk(step, completion.finish_reason,
                           num_prompt_tokens=len(out.prompt_token_ids),
                           num_cached_tokens=out.num_cached_tokens, num_output_tokens=num_output,
                           time_to_first_token=m.time_to_first_token,
                           tokens_per_s=_tokens_per_s(m, num_output))


def _image_tokens(prompt: ImagePrompt, width: int, height: int) -> int:
    """An image's tokens where they follow its size (SmolVLM's tiles, Qwen2.5-VL's merge
    units); 0 for one the model refuses (its shape: refused in words when the chat is sent)."""
    try:
        return prompt.tokens((width, height))
    except ImageInputError:
        return 0


def _expand(prompt: ImagePrompt, messages: Sequence[ChatMessage]) -> Callable[[str], str]:
    """What turns the rendered chat's markers into the placeholders of its images, in order."""
    return functools.partial(prompt.expand,
                             sizes=[(i.width, i.height) for m in messages for i in m.images])


def _template_dict(message: ChatMessage, prompt: ImagePrompt) -> dict[str, object]:
    """The message as the template reads it, its images as the model's markers after its text
    (the order ChatMessage.as_dict sends them to a server in)."""
    text_only = replace(message, images=())
    out = text_only.template_dict()
    if message.images:
        out["content"] = message.content + prompt.marker * len(message.images)
    return out


def _decoded_images(messages: Sequence[ChatMessage]) -> list[DecodedImage]:
    """The chat's images in order, decoded as the engine reads them (read_image checked them
    when they were attached)."""
    try:
        return [decode_image_bytes(image.data, image.mime_type, image.name)
                for m in messages for image in m.images]
    except ImageInputError as exc:
        raise ImagesRefusedError(f"{clause(exc)}.") from None


def _chat_key(messages: Sequence[ChatMessage], tools: list[dict] | None) -> tuple:
    """A chat as counted: its messages and the tools' definitions in its prompt."""
    return tuple(messages), json.dumps(tools, sort_keys=True) if tools else None


def _joined(first: Step, second: Step) -> Step:
    return Step(first.content + second.content, first.reasoning + second.reasoning)


def _tokens_per_s(m: RequestMetrics, num_tokens: int) -> float | None:
    if m.first_token_time is None or m.finished_time is None or num_tokens < 2:
        return None
    elapsed = m.finished_time - m.first_token_time
    return (num_tokens - 1) / elapsed if elapsed > 0 else None


def _on_off(enabled: bool) -> str:
    return "on" if enabled else "off"


def _stopped(exc: Exception, text: str) -> BackendStoppedError:
    return BackendStoppedError(f"The engine on this computer has stopped ({exc}): load a model "
                               "again to go on.", partial_text=text)
