"""What the app and a backend hand each other: plain dataclasses, in vLLM's vocabulary."""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pagoda.engine.sampling.fields import with_sampling_fields

Role = Literal["system", "user", "assistant", "tool"]
# Why a reply ended; "tool_calls": it stopped by itself after calling tools. A failure is never
# a finish reason: the stream raises a BackendError.
FinishReason = Literal["stop", "length", "abort", "tool_calls"]


@dataclass(slots=True, frozen=True)
class ToolSpec:
    """A function the model may call: its name, what it does, and its arguments' JSON schema
    (None: any JSON object)."""

    name: str
    description: str = ""
    parameters: dict | None = field(default=None, hash=False)

    def as_dict(self) -> dict:
        """OpenAI's tool definition."""
        function: dict = {"name": self.name}
        if self.description:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(slots=True, frozen=True)
class ToolCallRecord:
    """One call a reply made: `arguments` is the JSON text the model wrote (OpenAI's shape)."""

    id: str
    name: str
    arguments: str

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True, frozen=True)
class ChatImage:
    """An image that goes with a user's message: its encoded bytes (PNG, JPEG, WebP or GIF, as
    `mime_type` says, checked by pagoda.app.backends.images), its size in pixels, and a name to
    show."""

    mime_type: str
    data: bytes = field(repr=False)
    width: int
    height: int
    name: str = "image"

    def data_url(self) -> str:
        """The image inline, as OpenAI's image_url part takes it."""
        return f"data:{self.mime_type};base64,{base64.b64encode(self.data).decode('ascii')}"

    def part(self) -> dict[str, object]:
        return {"type": "image_url", "image_url": {"url": self.data_url()}}


@dataclass(slots=True, frozen=True)
class ChatMessage:
    """One message of a chat. An assistant's message may carry the `tool_calls` it made; a
    "tool" message is the result of the call whose id is `tool_call_id`; a user's, `images`."""

    role: Role
    content: str
    tool_calls: tuple[ToolCallRecord, ...] = ()
    tool_call_id: str | None = None
    # An assistant's reasoning before its answer. It reaches a chat template that reads it
    # (`reasoning_content`, as Qwen3's does for the turn being answered, dropping earlier ones);
    # servers are sent the answer alone, as OpenAI's API takes it.
    reasoning: str | None = None
    images: tuple[ChatImage, ...] = ()

    def __post_init__(self) -> None:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message cannot carry tool_calls: only the "
                             "assistant's can")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise ValueError("tool_call_id belongs to a tool message, and every tool message "
                             "names the call it answers")
        if self.images and self.role != "user":
            raise ValueError(f"a {self.role} message cannot carry images: only the user's can")

    def as_dict(self) -> dict[str, object]:
        """OpenAI's message: {"role", "content"}, with the calls or the call id where given; a
        message with images has its text and then its images as content parts."""
        message: dict[str, object] = {"role": self.role, "content": self.content}
        if self.images:
            text = [{"type": "text", "text": self.content}] if self.content else []
            message["content"] = text + [image.part() for image in self.images]
        if self.tool_calls:
            message["tool_calls"] = [call.as_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message

    def template_dict(self) -> dict[str, object]:
        """The message as a chat template reads it: OpenAI's, with the reasoning."""
        message = self.as_dict()
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return message


@dataclass(slots=True, frozen=True)
class ImageCost:
    """How many tokens an image takes in a prompt: scaled, its shape kept, to within
    `min_pixels` and `max_pixels`, then one token for each `patch_side` x `patch_side` pixels,
    plus `extra_tokens` (the markers around it). Qwen2-VL's processor counts so, 28 pixels a
    side; `exact` is False where the numbers are a guess at what the model does."""

    patch_side: int = 28
    min_pixels: int = 4 * 28 * 28
    max_pixels: int = 1280 * 28 * 28
    extra_tokens: int = 2
    exact: bool = False
    # A model whose every image takes the same tokens whatever its size (Gemma 3: 256 and its
    # markers); None: counted from its pixels as above.
    fixed_tokens: int | None = None
    # A model that counts an image's tokens its own way from (width, height), markers included
    # (a local SmolVLM's tiles, a local Qwen2.5-VL's merge units); None: counted as above.
    counted_by: Callable[[int, int], int] | None = None

    def tokens(self, width: int, height: int) -> int:
        if self.counted_by is not None:
            return self.counted_by(width, height)
        if self.fixed_tokens is not None:
            return self.fixed_tokens
        pixels = width * height
        scale = 1.0
        if pixels > self.max_pixels:
            scale = math.sqrt(self.max_pixels / pixels)
        elif pixels < self.min_pixels:
            scale = math.sqrt(self.min_pixels / pixels)
        side = self.patch_side
        across = max(1, round(width * scale / side))
        down = max(1, round(height * scale / side))
        return across * down + self.extra_tokens


@dataclass(slots=True, frozen=True)
class ImageInput:
    """Whether the backend's model takes images, and what one costs in its prompt.

    accepts: True (it does), False (text only: a chat says so before it sends an image), None
    (the backend cannot tell before it asks: a server is sent the images, and its refusal is
    said in words). cost: None where the backend does not say (the meter then guesses with
    ImageCost's defaults, marked an estimate). why: a text-only model's reason, in words.
    """

    accepts: bool | None
    cost: ImageCost | None = None
    why: str = ""


@dataclass(slots=True, frozen=True)
class ReplyFormat:
    """A reply that is JSON: any JSON object (`schema` None), or one that fits the JSON schema
    `schema`; `name` names the schema to servers that ask for one (OpenAI's json_schema.name)."""

    schema: dict | None = field(default=None, hash=False)
    name: str = "reply"


@dataclass(slots=True, frozen=True)
@with_sampling_fields()
class SamplingOptions:
    """How the reply is sampled and when it stops; what a conversation's settings ask for.

    The sampling knobs come first, one field per row of pagoda.engine.sampling.fields at the
    engine's defaults (temperature 0 is greedy; each neutral value turns its knob off); the
    table says which servers read each (a server that does not know one, such as OpenAI's own
    API for vLLM's extras, samples without it).
    """

    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # The functions the model may call, and whether it must: None or "auto" (its choice),
    # "none" (the tools stay out of the prompt), "required" (at least one call), or a tool's
    # name (a call of that function). A reply format and a forcing tool_choice exclude each
    # other: both would shape the whole reply.
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    reply_format: ReplyFormat | None = None
    # The chat template's thinking switch (`enable_thinking`, Qwen3's and others'); None leaves
    # the template's default. Sent where the backend has the switch (ChatBackend.thinking_switch).
    enable_thinking: bool | None = None


@dataclass(slots=True, frozen=True)
class PromptProgress:
    """How much of the prompt the backend has read before its reply begins: `num_computed_tokens`
    of `num_prompt_tokens` (tokens found in its prefix cache count as read)."""

    num_computed_tokens: int
    num_prompt_tokens: int


@dataclass(slots=True, frozen=True)
class ReplyChunk:
    """One step of a streamed reply: the new text and all of it so far, as well for the
    answer (`delta_text`, `text`) as for the model's reasoning before it (`delta_reasoning`,
    `reasoning`, empty for a model that does not reason aloud).

    `tool_calls` are the calls whose arguments are complete so far; the last chunk has every
    call the reply made (after finish_reason "length" the last one's arguments may be cut
    short). A chunk may bring nothing new but a piece of a call's arguments.

    The last chunk has `finish_reason` set; only it carries the counts and timings (any of which
    is None when the backend did not report it). `num_cached_tokens` is the prompt prefix the
    backend reused from earlier requests. A chunk with `prompt_progress` brings no text: the
    backend is still reading a long prompt, and says how far it is (where it can tell).
    """

    delta_text: str
    text: str
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    num_output_tokens: int | None = None
    time_to_first_token: float | None = None
    tokens_per_s: float | None = None
    prompt_progress: PromptProgress | None = None
    delta_reasoning: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallRecord, ...] = ()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True, frozen=True)
class TokenCount:
    """How many tokens a chat takes as a prompt; `exact` is False for an estimate."""

    n: int
    exact: bool


@dataclass(slots=True, frozen=True)
class BackendStats:
    """What the status bar shows. None where the backend cannot tell (a remote server's KV
    cache); speeds and times are measured where they can be, at the engine or at the client."""

    num_running: int = 0
    num_waiting: int | None = None
    kv_cache_usage: float | None = None
    prefix_cache_hit_rate: float | None = None
    tokens_per_s: float = 0.0
    time_to_first_token: float | None = None
    spec_acceptance_rate: float | None = None
    # Whether drafts are verified now and why (engine.EngineStats.spec_status / spec_reason).
    spec_status: str | None = None
    spec_reason: str | None = None


def chat_cache_tag(conversation_id: int) -> str:
    """The cache tag of a chat's replies (ChatBackend.stream): one name per conversation."""
    return f"conversation-{conversation_id}"
