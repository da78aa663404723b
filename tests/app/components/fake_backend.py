"""A backend, a source and a view for ChatSession's tests, driven by the test: what each reply
says and when, when the chat's counting holds, when the model is switched. No Qt, no engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from pagoda.app.backends import (
    BackendError,
    BackendStats,
    BackendStoppedError,
    ChatBackend,
    ChatMessage,
    ImageCost,
    ImageInput,
    ModelLoadingError,
    PromptProgress,
    ReplyChunk,
    SamplingOptions,
    TokenCount,
    ToolCallRecord,
    ToolSpec,
)
from pagoda.app.components.shared.view_models import (
    AttachmentView,
    FolderView,
    ImageView,
    MessageView,
    PassageView,
    SamplingView,
)

WAIT_S = 5.0
LOADING = "A model is loading: send again once it is ready."
NO_MODEL = "No model is loaded: choose one in the model picker."


async def eventually(condition, what: str) -> None:
    """Wait (a few seconds at most) until `condition()` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


@dataclass(eq=False)
class Request:
    """One stream the backend was asked for: what the model saw and what the test has it say."""

    id: str
    messages: list[ChatMessage]
    options: SamplingOptions
    continues: bool = False  # continue_final_message: goes on with the last (assistant) message
    cache_tag: str | None = None
    text: str = ""
    reasoning: str = ""
    ended: bool = False
    finish_reason: str | None = None
    _queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    @property
    def contents(self) -> list[tuple[str, str]]:
        return [(m.role, m.content) for m in self.messages]

    async def say(self, delta: str, finish_reason: str | None = None, **stats) -> None:
        """Stream `delta` (ending the reply when `finish_reason` is given, with the counts and
        timings in `stats`); returns once the chat took the chunk."""
        self.text += delta
        await self._hand_over(ReplyChunk(delta, self.text, finish_reason, **stats))

    async def think(self, delta: str) -> None:
        """Stream a piece of the model's reasoning (before its answer)."""
        self.reasoning += delta
        await self._hand_over(ReplyChunk("", self.text, delta_reasoning=delta,
                                         reasoning=self.reasoning))

    async def call_tools(self, *calls: ToolCallRecord) -> None:
        """End the reply by calling these tools, as a backend's last chunk says it."""
        await self._hand_over(ReplyChunk("", self.text, "tool_calls", reasoning=self.reasoning,
                                         tool_calls=calls))

    async def read(self, num_computed_tokens: int, num_prompt_tokens: int) -> None:
        """Report how much of the prompt is read, as a backend does before a long prompt's
        reply begins; returns once the chat took the chunk."""
        await self._hand_over(ReplyChunk("", self.text, prompt_progress=PromptProgress(
            num_computed_tokens, num_prompt_tokens)))

    async def finish(self, finish_reason: str = "stop", **stats) -> None:
        await self.say("", finish_reason, **stats)

    async def fail(self, error: BackendError) -> None:
        """Cut the stream short: it raises `error` (give it the partial_text a backend would)."""
        await self._hand_over(error)

    def end_with_abort(self) -> None:
        if not self.ended:
            self._queue.put_nowait((ReplyChunk("", self.text, "abort"), None))

    async def _hand_over(self, item: ReplyChunk | BackendError) -> None:
        taken = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, taken))
        await asyncio.wait_for(taken, WAIT_S)

    async def chunks(self) -> AsyncIterator[ReplyChunk]:
        try:
            while True:
                item, taken = await self._queue.get()
                if isinstance(item, BackendError):
                    _done(taken)
                    raise item
                yield item
                _done(taken)
                if item.finished:
                    self.finish_reason = item.finish_reason
                    return
        finally:
            self.ended = True


def _done(taken: asyncio.Future | None) -> None:
    if taken is not None and not taken.done():
        taken.set_result(None)


class CountGate:
    """Holds the backend's next count_tokens until `release()`."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self._release = asyncio.Event()

    async def wait_entered(self) -> None:
        await asyncio.wait_for(self.entered.wait(), WAIT_S)

    def release(self) -> None:
        self._release.set()

    async def pass_through(self) -> None:
        self.entered.set()
        await asyncio.wait_for(self._release.wait(), WAIT_S)


class ScriptedBackend:
    """A ChatBackend whose replies the test writes, chunk by chunk.

    A token is a word: `count_tokens` is exact. `requests` holds every stream in the order it
    started; `next_request()` waits for the next one.
    """

    location = "this test"
    max_model_len_known = True
    thinking_switch = False
    # It sees images, each at ImageCost's exact count (a test sets it text-only).
    image_input = ImageInput(True, ImageCost(exact=True))

    def __init__(self, model_name: str = "fake-model", max_model_len: int = 4096) -> None:
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.requests: list[Request] = []
        self.aborted: list[str] = []
        self.counted: list[list[ChatMessage]] = []
        self.is_shut_down = False
        self.counts_after_shutdown = False  # a remote server's estimate needs no running engine
        self._fail_next: BackendError | None = None
        self._count_gate: CountGate | None = None
        self._handed_out = 0

    # -- what the test does ----------------------------------------------------------------------

    async def next_request(self) -> Request:
        """The next stream the chat started (waiting for it)."""
        await eventually(lambda: len(self.requests) > self._handed_out, "a request")
        self._handed_out += 1
        return self.requests[self._handed_out - 1]

    def fail_next_stream(self, error: BackendError) -> None:
        """The next stream raises `error` before its first chunk."""
        self._fail_next = error

    def hold_next_count(self) -> CountGate:
        self._count_gate = CountGate()
        return self._count_gate

    @property
    def running(self) -> list[Request]:
        return [r for r in self.requests if not r.ended]

    # -- ChatBackend ------------------------------------------------------------------------------

    async def stream(self, messages: Sequence[ChatMessage], options: SamplingOptions,
                     request_id: str | None = None, *, continue_final_message: bool = False,
                     cache_tag: str | None = None) -> AsyncIterator[ReplyChunk]:
        if self.is_shut_down:
            raise BackendStoppedError(f"{self.model_name} was shut down.")
        if self._fail_next is not None:
            error, self._fail_next = self._fail_next, None
            raise error
        request = Request(request_id or f"fake-{len(self.requests)}", list(messages), options,
                          continue_final_message, cache_tag)
        self.requests.append(request)
        async for chunk in request.chunks():
            yield chunk

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        for request in self.running:
            if request.id == request_id:
                request.end_with_abort()

    def stats(self) -> BackendStats:
        return BackendStats(num_running=len(self.running))

    async def count_tokens(self, messages: Sequence[ChatMessage],
                           tools: Sequence[ToolSpec] = ()) -> TokenCount:
        """A word a token; a tool's name and description count too."""
        gate, self._count_gate = self._count_gate, None
        if gate is not None:
            await gate.pass_through()
        if self.is_shut_down and not self.counts_after_shutdown:
            raise BackendStoppedError(f"{self.model_name} was shut down.")
        self.counted.append(list(messages))
        words = sum(len(m.content.split()) for m in messages)
        words += sum(1 + len(tool.description.split()) for tool in tools)
        return TokenCount(words, exact=True)

    def shutdown(self) -> None:
        self.is_shut_down = True
        for request in self.running:
            request.end_with_abort()


class FakeSource:
    """A BackendSource: one backend in service, or none while a model loads."""

    def __init__(self, backend: ScriptedBackend | None = None) -> None:
        self._backend = backend
        self.loading = False

    @property
    def backend(self) -> ChatBackend | None:
        return self._backend

    def backend_for_new_request(self) -> ChatBackend:
        if self.loading:
            raise ModelLoadingError(LOADING)
        if self._backend is None:
            raise ModelLoadingError(NO_MODEL)
        return self._backend

    def start_loading(self) -> None:
        """A new model is loading: the current one still serves its replies, takes no new ones."""
        self.loading = True

    def swap(self, new: ScriptedBackend) -> None:
        """The new model is in: the old backend is shut down, as the engine host does."""
        old, self._backend = self._backend, new
        self.loading = False
        if old is not None:
            old.shutdown()


class RecordingView:
    """A ChatView that keeps every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def _record(self, name: str, *args) -> None:
        self.calls.append((name, args))

    def called(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]

    @property
    def deltas(self) -> list[str]:
        return [delta for _mid, delta in self.called("append_delta")]

    @property
    def notices(self) -> list[str]:
        return [text for text, _error in self.called("show_notice")]

    @property
    def drafts(self) -> list[str]:
        return [text for (text,) in self.called("restore_draft")]

    def show_messages(self, views: list[MessageView]) -> None:
        self._record("show_messages", views)

    def update_message(self, view: MessageView) -> None:
        self._record("update_message", view)

    def begin_stream(self, view: MessageView) -> None:
        self._record("begin_stream", view)

    def append_delta(self, message_id: int, delta: str) -> None:
        self._record("append_delta", message_id, delta)

    def append_reasoning(self, message_id: int, delta: str) -> None:
        self._record("append_reasoning", message_id, delta)

    def show_pending_attachments(self, views: list[AttachmentView]) -> None:
        self._record("show_pending_attachments", views)

    def show_pending_images(self, views: list[ImageView]) -> None:
        self._record("show_pending_images", views)

    def show_folders(self, views: list[FolderView]) -> None:
        self._record("show_folders", views)

    def show_passage(self, view: PassageView) -> None:
        self._record("show_passage", view)

    def show_reading(self, message_id: int, text: str | None) -> None:
        self._record("show_reading", message_id, text)

    def end_stream(self, view: MessageView) -> None:
        self._record("end_stream", view)

    def show_title(self, title: str) -> None:
        self._record("show_title", title)

    def show_notice(self, text: str, error: bool = False) -> None:
        self._record("show_notice", text, error)

    def show_streaming(self, streaming: bool) -> None:
        self._record("show_streaming", streaming)

    def show_can_regenerate(self, enabled: bool) -> None:
        self._record("show_can_regenerate", enabled)

    def show_settings(self, settings: SamplingView) -> None:
        self._record("show_settings", settings)

    def show_context_usage(self, used: int, max_model_len: int, max_tokens: int, *,
                           exact: bool = True) -> None:
        self._record("show_context_usage", used, max_model_len, max_tokens, exact)

    def restore_draft(self, text: str) -> None:
        self._record("restore_draft", text)

    def begin_edit(self, message_id: int, content: str) -> None:
        self._record("begin_edit", message_id, content)
