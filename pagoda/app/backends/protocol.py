"""The seam between the app and whatever writes its replies: the engine in this process, or an
OpenAI-compatible server elsewhere. The app asks nothing of a backend that is not here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from pagoda.app.backends.types import (
    BackendStats,
    ChatMessage,
    ImageInput,
    ReplyChunk,
    SamplingOptions,
    TokenCount,
    ToolSpec,
)


@runtime_checkable
class ChatBackend(Protocol):
    """Every method is called on the app's event loop thread, except `abort` and `stats`, which
    any thread may call. Nothing here blocks the loop.

    model_name: the model's name, as the backend reports it.
    location: where replies are written, in words ("this computer", or the server's address).
    max_model_len: the context length, prompt and reply together (the engine in this process:
    what its KV cache holds of it); `max_model_len_known` is False when the backend did not
    report it and it is a guess.
    """

    model_name: str
    location: str
    max_model_len: int
    max_model_len_known: bool
    # Whether the model's chat template has a thinking switch (`enable_thinking`) that
    # SamplingOptions.enable_thinking turns; False where the backend cannot tell.
    thinking_switch: bool
    # Whether the model takes images with a user's message, and what one costs (the meter);
    # a message with images sent to a model that takes none is refused in words.
    image_input: ImageInput

    def stream(self, messages: Sequence[ChatMessage], options: SamplingOptions,
               request_id: str | None = None, *, continue_final_message: bool = False,
               cache_tag: str | None = None) -> AsyncIterator[ReplyChunk]:
        """Yield the reply as it is written; the last chunk is finished and nothing follows it.
        With `continue_final_message` the last message is the assistant's unfinished reply and
        the chunks carry only what follows it (InvalidRequestError where the backend cannot).
        `cache_tag` (see `chat_cache_tag`) names the chat the reply belongs to, so a backend
        that keeps its cache on disk can remove what only that chat used; others ignore it.
        The options' tools, tool_choice and reply format reach the model or are refused
        (InvalidRequestError, naming the setting) before the reply begins; the chunks carry the
        reasoning and tool calls apart from the answer.

        Raises a BackendError subclass when no reply can be had or the reply is cut short
        (its `partial_text` holds what had arrived). Closing the iterator early aborts the reply.
        """

    def abort(self, request_id: str) -> None:
        """Stop that reply soon; its stream ends with finish_reason "abort". A request that is
        not running is ignored."""

    def stats(self) -> BackendStats: ...

    async def count_tokens(self, messages: Sequence[ChatMessage],
                           tools: Sequence[ToolSpec] = ()) -> TokenCount:
        """The chat's length as a prompt (with the generation prompt, and the functions in
        `tools` as the model is shown them), exact where the backend can tokenize it, else an
        estimate (`exact` False). Its text only: images are counted by
        pagoda.app.backends.images.count_chat, from `image_input`."""

    def shutdown(self) -> None:
        """Abort every reply in flight and release the backend; later streams raise
        BackendStoppedError."""
