"""One controller per tab: joins the conversation's branch in the store with a backend's stream."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from app.async_store import AsyncStore
from app.backends import BackendError, ChatBackend, ReplyChunk
from app.engine_host import EngineHost, ModelLoadingError
from app.prompting import (
    ContextOverflowError,
    FittedPrompt,
    chat_messages,
    fit_to_context,
    sampling_options,
    stats_text,
)
from app.store import Conversation, ConversationStore, GenerationStats, Message, StreamingWriter
from app.view_models import MessageView, SamplingView

logger = logging.getLogger(__name__)

MODEL_SWITCHED = ("The model was switched while this reply was being written: what it had "
                  "written is kept, marked interrupted. Regenerate to answer with the new model.")


@dataclass(slots=True)
class _Reply:
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


def message_view(m: Message, sibling_index: int = 0, sibling_count: int = 1) -> MessageView:
    stats = stats_text(m.stats, m.completion_tokens) if m.role == "assistant" else ""
    return MessageView(id=m.id, role=m.role, content=m.content, created_at=m.created_at,
                       status=m.status, sibling_index=sibling_index, sibling_count=sibling_count,
                       stats_text=stats, error=m.finish_reason if m.status == "error" else None)


def load_branch(store: ConversationStore, cid: int) -> tuple[Conversation, list[Message],
                                                               list[MessageView]]:
    """The conversation, its branch root to leaf, and the views with their sibling positions."""
    conversation = store.get_conversation(cid)
    path = store.current_path(cid)
    views = []
    for m in path:
        ids = [s.id for s in store.siblings(m.id)]
        views.append(message_view(m, ids.index(m.id), len(ids)))
    return conversation, path, views


class ChatController(QObject):
    """Drives one ChatTab. Every store call goes through AsyncStore; the GUI thread never waits.

    Signals: `conversation_changed(int)` when the sidebar should refresh (title, order);
    `streaming_changed(bool)`.
    """

    conversation_changed = Signal(int)
    streaming_changed = Signal(bool)

    def __init__(self, conversation_id: int, db: AsyncStore, host: EngineHost, view,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.conversation_id = conversation_id
        self.db = db
        self.host = host
        self.view = view
        self.conversation: Conversation | None = None
        self.path: list[Message] = []
        self.reply: _Reply | None = None
        self._views: list[MessageView] = []
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._connect_view()

    # -- wiring --------------------------------------------------------------------------------

    def _connect_view(self) -> None:
        v = self.view
        v.composer.send_requested.connect(lambda text: self.spawn(self.send(text)))
        v.composer.edit_submitted.connect(lambda mid, text: self.spawn(self.edit(mid, text)))
        v.composer.stop_requested.connect(self.stop)
        v.transcript.branch_requested.connect(lambda mid, d: self.spawn(self.switch_branch(mid, d)))
        v.transcript.edit_requested.connect(self._begin_edit)
        v.transcript.regenerate_requested.connect(lambda mid: self.spawn(self.regenerate(mid)))
        v.regenerate_button.clicked.connect(lambda: self.spawn(self.regenerate_last()))
        v.settings_changed.connect(lambda s: self.spawn(self.save_settings(s)))

    def spawn(self, coro) -> asyncio.Task:
        """Run a coroutine for this tab; a failure is shown in the tab, never lost in a log."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        logger.error("tab %s: %s", self.conversation_id, exc, exc_info=exc)
        if not self._closed:
            self.view.show_notice(f"Something went wrong: {exc}", error=True)

    @property
    def is_streaming(self) -> bool:
        return self.reply is not None

    # -- loading and settings --------------------------------------------------------------------

    async def open(self) -> None:
        """Show the conversation as stored: its current branch and its settings."""
        await self._reload()
        c = self.conversation
        self.view.set_settings(SamplingView.of(c.system_prompt, c.sampling))
        await self.refresh_context_meter()

    async def _reload(self, *, streaming: int | None = None, ending: int | None = None) -> None:
        """Re-read the branch and redraw what changed. `streaming` leaves that (new, empty) reply
        out for begin_stream to draw; `ending` is the reply whose stream just ended.
        """
        self.conversation, self.path, views = await self.db.run(
            lambda store: load_branch(store, self.conversation_id))
        if self._closed:
            return
        if streaming is not None:
            views = [v for v in views if v.id != streaming]
        self._render(views, ending)
        self.view.set_title(self.conversation.title or "New chat")
        self.view.set_can_regenerate(self._last_assistant() is not None and not self.is_streaming)

    def _render(self, views: list[MessageView], ending: int | None = None) -> None:
        """Redraw only the messages that changed: a full render of a long chat is slow."""
        transcript = self.view.transcript
        if [v.id for v in views] != [v.id for v in self._views]:
            transcript.set_messages(views)
        else:
            for new, old in zip(views, self._views, strict=True):
                if new.id == ending:
                    transcript.end_stream(new)
                elif new != old:
                    transcript.update_message(new)
        self._views = views

    async def save_settings(self, s: SamplingView) -> None:
        await self.db.update_settings(self.conversation_id, system_prompt=s.system_prompt or None,
                                      sampling=s.sampling())
        self.conversation = await self.db.get_conversation(self.conversation_id)
        await self.refresh_context_meter()

    async def refresh_context_meter(self) -> None:
        backend = self.host.backend
        if backend is None or self.conversation is None:
            return
        messages = chat_messages(self.conversation.system_prompt, self.path)
        used = 0
        if messages:
            try:
                used = (await backend.count_tokens(messages)).n
            except BackendError:
                return  # the model is being switched: the new one's load refreshes the meter
        if not self._closed:
            self.view.context_meter.set_usage(used, backend.max_model_len,
                                              self.conversation.sampling.max_tokens)

    # -- user actions ----------------------------------------------------------------------------

    async def send(self, text: str) -> None:
        if self.is_streaming or not self._check_backend():
            self.view.composer.set_text(text)
            return
        user = await self.db.append_user_message(self.conversation_id, text)
        self.conversation_changed.emit(self.conversation_id)
        await self._generate(user.id)

    async def edit(self, message_id: int, text: str) -> None:
        if self.is_streaming or not self._check_backend():
            return
        user = await self.db.edit_user_message(message_id, text)
        await self._generate(user.id)

    async def regenerate(self, assistant_id: int) -> None:
        if self.is_streaming or not self._check_backend():
            return
        message = next((m for m in self.path if m.id == assistant_id), None)
        if message is None or message.parent_id is None:
            return
        await self._generate(message.parent_id)

    async def regenerate_last(self) -> None:
        last = self._last_assistant()
        if last is not None:
            await self.regenerate(last.id)

    async def switch_branch(self, message_id: int, direction: int) -> None:
        if self.is_streaming:
            self.view.show_notice("Wait for the reply to finish (or stop it) to switch branches.")
            return
        siblings = await self.db.siblings(message_id)
        ids = [s.id for s in siblings]
        target = ids[(ids.index(message_id) + direction) % len(ids)]
        await self.db.switch_branch(target)
        await self._reload()
        await self.refresh_context_meter()

    async def show_branch_of(self, message_id: int) -> None:
        """Make the branch holding `message_id` the one shown (a search hit on another branch)."""
        if self.is_streaming:
            return
        await self.db.switch_branch(message_id)
        await self._reload()
        await self.refresh_context_meter()

    def stop(self) -> None:
        if self.reply is not None and self.reply.backend is not None:
            self.reply.backend.abort(self.reply.request_id)

    def _begin_edit(self, message_id: int) -> None:
        message = next((m for m in self.path if m.id == message_id), None)
        if message is not None and not self.is_streaming:
            self.view.composer.begin_edit(message_id, message.content)

    def _last_assistant(self) -> Message | None:
        return next((m for m in reversed(self.path) if m.role == "assistant"), None)

    def _check_backend(self) -> bool:
        try:
            self.host.backend_for_new_request()
        except ModelLoadingError as exc:
            self.view.show_notice(str(exc))
            return False
        return True

    # -- generation ------------------------------------------------------------------------------

    async def _generate(self, parent_id: int) -> None:
        message = await self.db.start_assistant_message(self.conversation_id, parent_id=parent_id,
                                                        model=self.host.model_name)
        self.reply = _Reply(message, f"conv{self.conversation_id}-msg{message.id}",
                            StreamingWriter(self.db.store, message.id))
        self._set_streaming(True)
        try:
            await self._reload(streaming=message.id)
            backend, fitted = await self._fit_on_current_backend()
            if fitted is not None:
                await self._stream(backend, fitted)
        except BackendError as exc:
            await self._end_on_error(exc)
        finally:
            self.reply = None
            if not self._closed:
                self._set_streaming(False)
                await self._reload(ending=message.id)
                await self.refresh_context_meter()
                self.conversation_changed.emit(self.conversation_id)

    async def _fit_on_current_backend(self) -> tuple[ChatBackend, FittedPrompt | None]:
        """The backend to stream on and the prompt fitted to it, fitted again when the model was
        switched meanwhile. Raises ModelLoadingError once a model is loading."""
        while True:
            backend = self.host.backend_for_new_request()
            try:
                fitted = await self._fit_prompt(backend)
            except BackendError:
                if self.host.backend_for_new_request() is backend:
                    raise
                continue  # the backend stopped as the model was switched: fit to the new one
            if fitted is None or self.host.backend_for_new_request() is backend:
                return backend, fitted

    async def _stream(self, backend: ChatBackend, fitted: FittedPrompt) -> None:
        # A switch can still come while the backend tokenizes the chat: the stream then ends
        # with "abort" or raises BackendStoppedError, and the tab says the model was switched.
        reply = self.reply
        options = sampling_options(self.conversation.sampling, fitted.max_tokens)
        view = message_view(reply.message)
        self.view.transcript.begin_stream(view)
        self._views = [*self._views, view]
        reply.backend = backend
        async for chunk in backend.stream(fitted.messages, options, reply.request_id):
            await self._on_chunk(chunk)
        await self._finish(backend.model_name)

    async def _fit_prompt(self, backend: ChatBackend) -> FittedPrompt | None:
        messages = chat_messages(self.conversation.system_prompt, self.path[:-1])
        max_model_len = backend.max_model_len
        try:
            fitted = await fit_to_context(messages, backend.count_tokens, max_model_len,
                                          self.conversation.sampling.max_tokens)
        except ContextOverflowError as exc:
            await self._fail(str(exc))
            return None
        if fitted.num_dropped:
            self.view.show_notice(
                f"This chat is longer than the model's context ({max_model_len} "
                f"tokens): the {fitted.num_dropped} oldest messages were left out of what the "
                "model sees for this reply. They stay in the chat.")
        return fitted

    async def _on_chunk(self, chunk: ReplyChunk) -> None:
        reply = self.reply
        delta = chunk.delta_text
        reply.last_chunk = chunk
        if not delta or self._closed:
            return
        reply.text += delta
        self.view.transcript.append_delta(reply.message.id, delta)
        # Not awaited: the worker applies writes in order, and the stream need not wait for disk.
        self.db.submit(lambda _store, d=delta: reply.writer.append(d))

    async def _finish(self, model: str) -> None:
        reply = self.reply
        last = reply.last_chunk
        if self._closed:
            return
        if last is None or last.finish_reason in (None, "abort"):
            await self._keep_interrupted()
        else:
            await self.db.run(lambda _store: reply.writer.finish(
                last.finish_reason, _generation_stats(last, model),
                prompt_tokens=last.num_prompt_tokens, completion_tokens=last.num_output_tokens))

    async def _fail(self, error: str) -> None:
        writer = self.reply.writer
        await self.db.run(lambda _store: writer.closed or writer.fail(error))
        self.view.show_notice(error, error=True)

    async def _end_on_error(self, exc: BackendError) -> None:
        """A reply cut by a model switch is kept, and said so; one cut by a failure after text
        arrived is kept too, with the failure shown; one that never began fails."""
        if self._backend_was_switched():
            await self._keep_interrupted()
        elif exc.partial_text or self.reply.text:
            await self._keep_interrupted()
            if not self._closed:
                self.view.show_notice(str(exc), error=True)
        else:
            await self._fail(str(exc))

    async def _keep_interrupted(self) -> None:
        """Keep the reply so far; say why when it was not the user's Stop."""
        writer = self.reply.writer
        await self.db.run(lambda _store: writer.closed or writer.interrupt())
        if self._backend_was_switched() and not self._closed:
            self.view.show_notice(MODEL_SWITCHED, error=True)

    def _backend_was_switched(self) -> bool:
        backend = self.reply.backend
        return backend is not None and backend is not self.host.backend

    def _set_streaming(self, streaming: bool) -> None:
        self.view.composer.set_streaming(streaming)
        self.view.set_can_regenerate(not streaming and self._last_assistant() is not None)
        self.streaming_changed.emit(streaming)

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Keep a streaming reply as interrupted, synchronously: the app may exit right after."""
        self._closed = True
        reply = self.reply
        if reply is None:
            return
        if reply.backend is not None:
            reply.backend.abort(reply.request_id)
        self.db.drain()
        if not reply.writer.closed:
            reply.writer.interrupt()


def _generation_stats(last: ReplyChunk, model: str) -> GenerationStats:
    return GenerationStats(model=model, ttft_s=last.time_to_first_token,
                           tokens_per_s=last.tokens_per_s, cached_tokens=last.num_cached_tokens)
