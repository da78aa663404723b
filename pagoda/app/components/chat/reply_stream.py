"""One reply streamed into its message: fitted to the backend in service (again, when the model
is switched meanwhile), its chunks drawn and written (throttled) to the store, and ended as
finished, stopped, interrupted or failed, in words. No Qt."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pagoda.app.backends import (
    BackendError,
    ChatBackend,
    PromptProgress,
    ReplyChunk,
    ToolSpec,
    chat_cache_tag,
)
from pagoda.app.backends.images import count_chat
from pagoda.app.components.chat.branch import message_view
from pagoda.app.components.chat.prompting import (
    ContextOverflowError,
    FittedPrompt,
    fit_to_context,
    sampling_options,
)
from pagoda.app.components.chat.session_seam import StreamHost
from pagoda.app.components.chat.tool_turns import stored_calls
from pagoda.app.store import GenerationStats, Message, StreamingWriter


MODEL_SWITCHED = ("The model was switched while this reply was being written: what it had "
                  "written is kept, marked interrupted. Regenerate to answer with the new model.")

ToolSpecs = Callable[[int], Awaitable[tuple[ToolSpec, ...]]]


@dataclass(slots=True)
class Reply:
    """The reply being streamed: its message, request, text so far, its throttled writer, its
    last chunk and the backend its request runs on (None until it starts).

    The writer is only touched on the store's worker thread.
    """

    message: Message
    request_id: str
    writer: StreamingWriter
    text: str = ""
    last_chunk: ReplyChunk | None = None
    backend: ChatBackend | None = None
    continuing: bool = False  # the message held a reply cut at its max tokens: it grows
    reading: str | None = None  # how far the backend has read the prompt, until text comes
    reasoning: str = ""
    documents: bool = False  # the prompt holds the chat's documents (whole or passages)


class ReplyStream:
    """Writes a session's replies, one at a time; `reply` is the one streaming (None between)."""

    def __init__(self, session: StreamHost, tool_specs: ToolSpecs) -> None:
        self.session = session
        self.tool_specs = tool_specs  # the chat's tools as the model is shown them
        self.reply: Reply | None = None

    async def write(self, message: Message, continuing: bool = False, *,
                    with_tools: bool = False) -> None:
        """Stream the reply into `message`: a new, empty one, or (`continuing`) one cut at its
        max tokens, which grows; `with_tools`: the chat's tools are offered to the model."""
        s = self.session
        writer = StreamingWriter(s.db.store, message.id, text=message.content)
        self.reply = Reply(message, f"conv{s.conversation_id}-msg{message.id}", writer,
                           text=message.content, continuing=continuing)
        s.turn.begin_streaming()
        try:
            await s.reload(streaming=message.id)
            if s.closed:
                return  # closed while the branch was read: kept interrupted below
            tools = await self.tool_specs(message.id) if with_tools else ()
            backend, fitted = await self._fit_on_current_backend(tools)
            if fitted is not None and s.stop_requested:
                await self._keep_stopped(None, "")  # stopped before it began: kept, empty
            elif fitted is not None and not s.closed:
                await self._stream(backend, fitted, tools)
        except BackendError as exc:
            await self._end_on_error(exc)
        finally:
            self.reply = None
            if s.closed:  # closed at any await above: the reply is kept, interrupted
                s.db.submit(lambda _store: writer.closed or writer.interrupt())
            else:
                await s.reload(ending=message.id)

    def stop(self) -> None:
        """The user's Stop: the reply reads "stopping…" at once, and its request is aborted."""
        reply = self.reply
        if reply is not None:
            self.session.view.show_reading(reply.message.id, "stopping…")
            if reply.backend is not None:
                reply.backend.abort(reply.request_id)

    def close(self) -> None:
        """Abort a streaming reply and queue its ending as interrupted on the store's worker."""
        reply = self.reply
        if reply is None:
            return
        if reply.backend is not None:
            reply.backend.abort(reply.request_id)
        writer = reply.writer
        self.session.db.submit(lambda _store: writer.closed or writer.interrupt())

    async def _fit_on_current_backend(self, tools: tuple[ToolSpec, ...] = (),
                                      ) -> tuple[ChatBackend, FittedPrompt | None]:
        """The backend to stream on and the prompt fitted to it, fitted again when the model was
        switched meanwhile. Raises ModelLoadingError once a model is loading."""
        source = self.session.source
        while True:
            backend = source.backend_for_new_request()
            try:
                fitted = await self._fit_prompt(backend, tools)
            except BackendError:
                if source.backend_for_new_request() is backend:
                    raise
                continue  # the backend stopped as the model was switched: fit to the new one
            if fitted is None or source.backend_for_new_request() is backend:
                return backend, fitted

    async def _stream(self, backend: ChatBackend, fitted: FittedPrompt,
                      tools: tuple[ToolSpec, ...]) -> None:
        # A switch can still come while the backend tokenizes the chat: the stream then ends
        # with "abort" or raises BackendStoppedError, and the tab says the model was switched.
        s, reply = self.session, self.reply
        s.meter.show_prompt(backend, fitted)
        options = sampling_options(s.conversation.sampling, fitted.max_tokens, tools=tools,
                                   thinking_switch=backend.thinking_switch)
        view = message_view(reply.message)
        s.view.begin_stream(view)
        s.views = [*s.views, view]
        reply.backend = backend
        extra = {"continue_final_message": True} if reply.continuing else {}
        async for chunk in backend.stream(fitted.messages, options, reply.request_id,
                                          cache_tag=chat_cache_tag(s.conversation_id),
                                          **extra):
            self._on_chunk(chunk)
        await self._finish(backend.model_name)

    async def _fit_prompt(self, backend: ChatBackend,
                          tools: tuple[ToolSpec, ...]) -> FittedPrompt | None:
        s, reply = self.session, self.reply
        # The branch without the reply being written; a reply being continued is kept, as the
        # text the model goes on from.
        branch = s.path if reply.continuing else s.path[:-1]
        shaped = await s.files.prompt(backend, branch, tools, reply.message.id)
        max_model_len = backend.max_model_len
        if shaped.citations and not reply.continuing:
            await s.db.set_sources(reply.message.id, shaped.citations)
        reply.documents = shaped.has_documents
        try:
            fitted = await fit_to_context(shaped.messages,
                                          lambda kept: count_chat(backend, kept, tools),
                                          max_model_len, s.conversation.sampling.max_tokens)
        except ContextOverflowError as exc:
            await self._fail(str(exc))
            return None
        if fitted.num_dropped:
            dropped = ("the oldest message was" if fitted.num_dropped == 1
                       else f"the {fitted.num_dropped} oldest messages were")
            s.notify(
                f"This chat is longer than the model's context ({max_model_len:,} "
                f"tokens): {dropped} left out of what the model sees for this reply. They "
                "stay in the chat.")
        return fitted

    def _on_chunk(self, chunk: ReplyChunk) -> None:
        s, reply = self.session, self.reply
        delta = chunk.delta_text
        reply.last_chunk = chunk
        if s.closed or s.stop_requested:
            # After Stop the reply stays as the user saw it when they pressed it; what the
            # backend wrote before it heard is neither drawn nor kept, so a backlog of chunks
            # (three tabs streaming) does not hold the stop up.
            return
        if chunk.prompt_progress is not None:
            reply.reading = reading_text(chunk.prompt_progress, reply.continuing,
                                         reply.documents)
            s.view.show_reading(reply.message.id, reply.reading)
        if chunk.delta_reasoning:
            self._on_reasoning(chunk.delta_reasoning)
        if not delta:
            return
        self._end_reading()
        reply.text += delta
        s.view.append_delta(reply.message.id, delta)
        # Not awaited: the worker applies writes in order, and the stream need not wait for disk.
        s.db.submit(lambda _store, d=delta: reply.writer.append(d))

    def _end_reading(self) -> None:
        """The reply writes: what it was reading is no longer said."""
        reply = self.reply
        if reply.reading is not None:
            reply.reading = None
            self.session.view.show_reading(reply.message.id, None)

    def _on_reasoning(self, delta: str) -> None:
        reply = self.reply
        self._end_reading()
        reply.reasoning += delta
        self.session.view.append_reasoning(reply.message.id, delta)
        self.session.db.submit(lambda _store, d=delta: reply.writer.append_reasoning(d))

    async def _finish(self, model: str) -> None:
        s, reply = self.session, self.reply
        last = reply.last_chunk
        if s.closed:
            return
        if last is not None and last.tool_calls:
            calls = stored_calls(last.tool_calls)
            s.db.submit(lambda _store: reply.writer.set_tool_calls(calls))
        if last is not None and last.finish_reason == "abort" and s.stop_requested \
                and not self._backend_was_switched():
            await self._keep_stopped(last, model)
        elif last is None or last.finish_reason in (None, "abort"):
            await self._keep_interrupted()
        else:
            await s.db.run(lambda _store: reply.writer.finish(
                last.finish_reason, _generation_stats(last, model),
                prompt_tokens=last.num_prompt_tokens, completion_tokens=_written(reply, last)))

    async def _fail(self, error: str) -> None:
        writer = self.reply.writer
        await self.session.db.run(lambda _store: writer.closed or writer.fail(error))
        if not self.session.closed:
            self.session.notify(error, error=True)

    async def _end_on_error(self, exc: BackendError) -> None:
        """A reply cut by a model switch is kept, and said so; one cut by a failure after text
        arrived is kept too, with the failure shown; one that never began fails."""
        if self._backend_was_switched():
            await self._keep_interrupted()
        elif exc.partial_text or self.reply.text or self.reply.reasoning:
            await self._keep_interrupted()
            if not self.session.closed:
                self.session.notify(str(exc), error=True)
        else:
            await self._fail(str(exc))

    async def _keep_stopped(self, last: ReplyChunk | None, model: str) -> None:
        """The user's Stop: kept as "stopped", with the figures the backend gave for it."""
        reply = self.reply
        writer = reply.writer
        stats = _generation_stats(last, model) if last is not None else None
        await self.session.db.run(lambda _store: writer.closed or writer.interrupt(
            "stopped", stats, prompt_tokens=last and last.num_prompt_tokens,
            completion_tokens=last and _written(reply, last)))

    async def _keep_interrupted(self) -> None:
        """Keep the reply so far; say why when it was not the user's Stop."""
        writer = self.reply.writer
        await self.session.db.run(lambda _store: writer.closed or writer.interrupt())
        if self._backend_was_switched() and not self.session.closed:
            self.session.notify(MODEL_SWITCHED, error=True)

    def _backend_was_switched(self) -> bool:
        backend = self.reply.backend
        return backend is not None and backend is not self.session.source.backend


def reading_text(progress: PromptProgress, continuing: bool = False,
                 documents: bool = False) -> str:
    """"reading your message: 1,200 / 3,300 tokens" (the whole chat is read, but what is new
    to the model, and slow, is nearly always the message just sent, or the documents)."""
    what = "your documents" if documents else "the chat" if continuing else "your message"
    return (f"reading {what}: {progress.num_computed_tokens:,} / "
            f"{progress.num_prompt_tokens:,} tokens")


def _written(reply: Reply, last: ReplyChunk) -> int | None:
    """The reply's tokens: a continued reply's earlier ones and the new ones together."""
    if last.num_output_tokens is None or not reply.continuing:
        return last.num_output_tokens
    return (reply.message.completion_tokens or 0) + last.num_output_tokens


def _generation_stats(last: ReplyChunk, model: str) -> GenerationStats:
    return GenerationStats(model=model, ttft_s=last.time_to_first_token,
                           tokens_per_s=last.tokens_per_s, cached_tokens=last.num_cached_tokens)
