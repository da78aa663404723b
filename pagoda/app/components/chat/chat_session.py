"""One open chat, without a window: its branch, its streaming reply, its settings, the notice it
shows. It joins the conversation in the store with a backend's stream and tells a `ChatView`
what changed; the tab's widgets are one such view, the tests another."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from pagoda.app.backends import (
    BackendError,
    ChatBackend,
    ChatMessage,
    ModelLoadingError,
    PromptProgress,
    ReplyChunk,
    ToolSpec,
    chat_cache_tag,
)
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.documents.chat_documents import ChatDocuments, DocumentPrompt, attachment_views
from pagoda.app.components.documents.folder_index import ChatFolders, FolderError
from pagoda.app.components.chat.prompting import (
    ContextOverflowError,
    FittedPrompt,
    chat_messages,
    fit_to_context,
    sampling_options,
    stats_text,
)
from pagoda.app.components.shared.tasks import TaskSet
from pagoda.app.components.chat.tool_turns import (
    DECISIONS,
    DENIED,
    STOPPED,
    CallKey,
    Decision,
    call_outcomes,
    call_views,
    over_the_limit,
    stored_calls,
    turn_start,
)
from pagoda.app.components.shared.tool_seam import ChatTools, ToolOutcome
from pagoda.app.components.shared.view_models import (
    AttachmentView,
    FolderView,
    MessageView,
    PassageView,
    SamplingView,
    SourceView,
    ToolCallState,
)
from pagoda.app.store import (
    Conversation,
    ConversationStore,
    GenerationStats,
    Message,
    StoreError,
    StreamingWriter,
    ToolCall,
)

logger = logging.getLogger(__name__)

MODEL_SWITCHED = ("The model was switched while this reply was being written: what it had "
                  "written is kept, marked interrupted. Regenerate to answer with the new model.")
WAIT_TO_SWITCH = "Wait for the reply to finish (or stop it) to switch branches."
READING_FOLDERS = "looking for changes in the chat's folders…"
STOPPING = "stopping…"


class BackendSource(Protocol):
    """Where a chat's replies come from: the engine host, or a saved remote connection.

    `backend_for_new_request()` raises ModelLoadingError while there is none; `backend` is the
    one in service now (None while none is), so a reply can tell it was switched.
    """

    @property
    def backend(self) -> ChatBackend | None: ...

    def backend_for_new_request(self) -> ChatBackend: ...


class ChatView(Protocol):
    """What a session tells whoever shows it. Every method is called on the event loop."""

    def show_messages(self, views: list[MessageView]) -> None: ...
    def update_message(self, view: MessageView) -> None: ...
    def begin_stream(self, view: MessageView) -> None: ...
    def append_delta(self, message_id: int, delta: str) -> None: ...
    def append_reasoning(self, message_id: int, delta: str) -> None:
        """More of a streaming reply's reasoning, shown apart from (above) its answer."""
    def show_reading(self, message_id: int, text: str | None) -> None:
        """What a streaming reply is doing before its text comes (how much of a long prompt the
        model has read); None once it writes."""
    def end_stream(self, view: MessageView) -> None: ...
    def show_pending_attachments(self, views: list[AttachmentView]) -> None:
        """The files waiting in the composer: being read, ready, or failed and why."""
    def show_passage(self, view: PassageView) -> None:
        """A passage a reply cited, opened."""
    def show_folders(self, views: list[FolderView]) -> None:
        """The folders the chat answers from, and where their indexing stands."""
    def show_title(self, title: str) -> None: ...
    def show_notice(self, text: str, error: bool = False) -> None: ...
    def show_streaming(self, streaming: bool) -> None: ...
    def show_can_regenerate(self, enabled: bool) -> None: ...
    def show_settings(self, settings: SamplingView) -> None: ...
    def show_context_usage(self, used: int, max_model_len: int, max_tokens: int, *,
                           exact: bool = True) -> None: ...
    def restore_draft(self, text: str) -> None: ...
    def begin_edit(self, message_id: int, content: str) -> None: ...


class NullView:
    """Shows nothing: a session's view until one is attached."""

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *_args, **_kwargs: None


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


def message_view(m: Message, sibling_index: int = 0, sibling_count: int = 1,
                 attachments: tuple[AttachmentView, ...] = ()) -> MessageView:
    stats = stats_text(m.stats, m.completion_tokens) if m.role == "assistant" else ""
    return MessageView(id=m.id, role=m.role, content=m.content, created_at=m.created_at,
                       status=m.status, sibling_index=sibling_index, sibling_count=sibling_count,
                       stats_text=stats, error=m.error if m.status == "error" else None,
                       finish_reason=m.finish_reason, completion_tokens=m.completion_tokens,
                       reasoning=m.reasoning, reasoning_s=m.reasoning_s, tool_name=m.tool_name,
                       attachments=attachments,
                       sources=tuple(SourceView(c.number, c.name, c.page, c.heading, c.ordinal)
                                     for c in m.sources))


def load_branch(store: ConversationStore, cid: int) -> tuple[Conversation, list[Message],
                                                               list[MessageView]]:
    """The conversation, its branch root to leaf, and the views with their sibling positions."""
    conversation = store.get_conversation(cid)
    path = store.current_path(cid)
    documents = attachment_views(store.attachments(cid))
    views = []
    for m in path:
        ids = [s.id for s in store.siblings(m.id)]
        views.append(message_view(m, ids.index(m.id), len(ids), documents.get(m.id, ())))
    return conversation, path, views


class ChatSession:
    """One open chat. Every store call goes through AsyncStore; nothing here waits on a thread.

    State the view renders: `views` (the branch shown), `title`, `notice` ((text, is_error) or
    None), `is_streaming`, `can_regenerate`, `settings`, `context_usage` ((used, context,
    max_tokens) or None). `on_conversation_changed(cid)` fires when the chat list should
    refresh (a new message, a reply ended); `on_streaming_changed(bool)` when a reply starts or
    ends.
    """

    def __init__(self, conversation_id: int, db: AsyncStore, source: BackendSource,
                 view: ChatView | None = None, tools: ChatTools | None = None) -> None:
        self.conversation_id = conversation_id
        self.db = db
        self.source = source
        self.tools = tools  # where the model's calls go; None: this chat's model calls nothing
        self.documents = ChatDocuments(db)
        self.documents.on_pending_changed = lambda views: self.view.show_pending_attachments(views)
        self.folders = ChatFolders(conversation_id, db)
        self.folders.on_changed = lambda views: self.view.show_folders(views)
        self.folders.on_settled = lambda: self.spawn(self.refresh_context_meter())
        self.folders.on_error = self._action_failed
        self.documents.folder_files = self.folders.documents
        self.view: ChatView = view or NullView()
        self.conversation: Conversation | None = None
        self.path: list[Message] = []
        self.views: list[MessageView] = []
        self.reply: Reply | None = None
        self.title = "New chat"
        self.notice: tuple[str, bool] | None = None
        self.can_regenerate = False
        self.settings = SamplingView()
        self.context_usage: tuple[int, int, int] | None = None
        self.draft = ""  # the message being typed, counted in the context meter
        self._meter_counts = 0
        self.on_conversation_changed: Callable[[int], None] = lambda _cid: None
        self.on_streaming_changed: Callable[[bool], None] = lambda _streaming: None
        self._tasks = TaskSet(self._action_failed)
        self._replying = False  # from the user's action until its reply has ended
        self._streamed = False  # the view was told a reply streams (told again when it ends)
        self._stop_requested = False
        # The turn's calls waiting for the user's Run or Deny, and the one running.
        self._call_states: dict[CallKey, ToolCallState] = {}
        self._decisions: dict[CallKey, asyncio.Future[Decision]] = {}
        self._running_call: asyncio.Task[ToolOutcome] | None = None
        self._offered: tuple[tuple[str, ...], tuple[ToolSpec, ...]] = ((), ())
        self.closed = False

    @property
    def is_streaming(self) -> bool:
        """A reply is on its way: from the moment the user's message is being stored until
        the reply has ended. Sending, editing, regenerating and switching wait until then."""
        return self._replying or self.reply is not None

    # -- running the user's actions --------------------------------------------------------------

    def spawn(self, coro) -> asyncio.Task:
        """Run a coroutine for this chat; a failure is shown in the chat, never lost in a log."""
        return self._tasks.spawn(coro)

    def _action_failed(self, exc: BaseException) -> None:
        logger.error("chat %s: %s", self.conversation_id, exc, exc_info=exc)
        if not self.closed:
            self._notify(f"Something went wrong: {exc}", error=True)

    async def wait_idle(self) -> None:
        """Wait for every action started with `spawn` (tests, and closing in order)."""
        await self._tasks.wait_idle()

    # -- loading and settings --------------------------------------------------------------------

    async def open(self) -> None:
        """Show the conversation as stored: its current branch and its settings."""
        await self._reload()
        if self.closed:
            return
        c = self.conversation
        self.settings = SamplingView.of(c.system_prompt, c.sampling)
        self.view.show_settings(self.settings)
        await self.folders.open()
        await self.refresh_context_meter()

    async def _reload(self, *, streaming: int | None = None, ending: int | None = None) -> None:
        """Re-read the branch and redraw what changed. `streaming` leaves that (new, empty) reply
        out for begin_stream to draw; `ending` is the reply whose stream just ended.
        """
        conversation, path, views = await self.db.run(
            lambda store: load_branch(store, self.conversation_id))
        if self.closed:
            return
        self.conversation, self.path = conversation, path
        views = self._with_max_tokens(self._with_calls(path, views))
        if streaming is not None:
            views = [v for v in views if v.id != streaming]
        self._render(views, ending)
        self._set_title(conversation.title or "New chat")
        self._set_can_regenerate()

    def _with_calls(self, path: list[Message], views: list[MessageView]) -> list[MessageView]:
        """The views with each reply's calls and where they stand."""
        outcomes = call_outcomes(path)
        return [replace(v, tool_calls=call_views(m, outcomes, self._call_states, self.tools))
                if m.tool_calls else v for m, v in zip(path, views, strict=True)]

    def _with_max_tokens(self, views: list[MessageView]) -> list[MessageView]:
        """The views with the chat's max tokens on each reply cut at them (its note says them
        where they differ from its length: a reply continued)."""
        max_tokens = self.conversation.sampling.max_tokens
        return [replace(v, max_tokens=max_tokens) if v.finish_reason == "length" else v
                for v in views]

    def _render(self, views: list[MessageView], ending: int | None = None) -> None:
        """Redraw only the messages that changed: a full render of a long chat is slow."""
        if [v.id for v in views] != [v.id for v in self.views]:
            self.view.show_messages(views)
        else:
            for new, old in zip(views, self.views, strict=True):
                if new.id == ending:
                    self.view.end_stream(new)
                elif new != old:
                    self.view.update_message(new)
        self.views = views

    def rename(self, title: str) -> None:
        """The title as stored elsewhere (the sidebar's rename)."""
        self._set_title(title)

    async def save_settings(self, settings: SamplingView) -> None:
        self.settings = settings
        await self.db.update_settings(self.conversation_id,
                                      system_prompt=settings.system_prompt or None,
                                      sampling=settings.sampling())
        self.conversation = await self.db.get_conversation(self.conversation_id)
        if not self.closed:
            self._render(self._with_max_tokens(self.views))
        await self.refresh_context_meter()

    async def count_draft(self, text: str) -> None:
        """The message being typed counts in the context meter (the caller debounces), so an
        over-long paste is flagged before it is sent."""
        self.draft = text
        await self.refresh_context_meter()

    async def refresh_context_meter(self) -> None:
        """Count the branch (and the draft, if any) with the backend's tokenizer, off the loop;
        an older count that comes back after a newer one is dropped."""
        backend = self.source.backend
        if backend is None or self.conversation is None:
            return
        self._meter_counts += 1
        ticket = self._meter_counts
        messages = chat_messages(self.conversation.system_prompt, self.path)
        if self.draft.strip() and not self.is_streaming:
            messages.append(ChatMessage("user", self.draft))
        used, exact = 0, True
        if messages or self.documents.views:
            try:
                count = await self.documents.counted(
                    messages, self.path, backend.count_tokens, self._tools_in_prompt(),
                    backend.max_model_len, self.conversation.sampling.max_tokens)
            except BackendError:
                return  # the model is being switched: the new one's load refreshes the meter
            used, exact = count.n, count.exact and backend.max_model_len_known
        if not self.closed and ticket == self._meter_counts:
            self.context_usage = (used, backend.max_model_len,
                                  self.conversation.sampling.max_tokens)
            self.view.show_context_usage(*self.context_usage, exact=exact)

    # -- the user's actions ----------------------------------------------------------------------

    async def send(self, text: str) -> None:
        if self.is_streaming or not self._check_backend() or self._still_reading():
            self.view.restore_draft(text)
            return
        self.draft = ""
        async with self._replying_now():
            user = await self.db.append_user_message(self.conversation_id, text)
            await self.documents.keep_with(user.id)
            self.on_conversation_changed(self.conversation_id)
            await self._generate(user.id)

    def _still_reading(self) -> bool:
        name = self.documents.reading
        if name is not None:
            self._notify(f"{name} is still being read: send once it is ready (or remove it).")
        return name is not None

    # -- documents -------------------------------------------------------------------------------

    async def attach(self, paths: list[str]) -> None:
        """Files for the next message: read off the loop, shown waiting in the composer. A
        folder among them (dropped on the chat) becomes one of the chat's folders."""
        folders = [path for path in paths if Path(path).is_dir()]
        for folder in folders:
            await self.add_folder(folder)
        files = [path for path in paths if path not in folders]
        if files:
            await self.documents.attach(files)
        await self.refresh_context_meter()

    async def add_folder(self, path: str) -> None:
        """The chat answers from the folder's files too, indexed in the background; one that
        cannot be added is said in the chat's notice."""
        try:
            await self.folders.add(path)
        except (FolderError, StoreError) as exc:
            self._notify(f"This folder cannot be added: {exc}", error=True)

    async def remove_folder(self, folder_id: int) -> None:
        """The chat no longer answers from the folder; its index is deleted."""
        await self.folders.remove(folder_id)
        await self.refresh_context_meter()

    def remove_pending(self, index: int) -> None:
        self.documents.remove(index)
        self.spawn(self.refresh_context_meter())

    async def open_source(self, message_id: int, number: int) -> None:
        """Show the passage a reply cited as [number]."""
        message = next((m for m in self.path if m.id == message_id), None)
        citation = next((c for c in message.sources if c.number == number), None) \
            if message is not None else None
        if citation is None:
            return
        self.view.show_passage(await self.documents.passage(citation))

    async def edit(self, message_id: int, text: str) -> None:
        if self.is_streaming or not self._check_backend():
            return
        async with self._replying_now():
            user = await self.db.edit_user_message(message_id, text)
            await self._generate(user.id)

    async def regenerate(self, assistant_id: int) -> None:
        """A new reply to the user's message `assistant_id` answered, beside the old one: a
        turn that called tools is run again from the user's message."""
        if self.is_streaming or not self._check_backend():
            return
        message = next((m for m in self.path if m.id == assistant_id), None)
        if message is None or message.parent_id is None:
            return
        async with self._replying_now():
            await self._generate(turn_start(self.path, assistant_id) or message.parent_id)

    @contextlib.asynccontextmanager
    async def _replying_now(self):
        """Mark the chat busy for one action, before its first await: a second action (or a
        click on Regenerate) while the first stores its message is refused, not interleaved."""
        self._replying, self._stop_requested = True, False
        try:
            yield
        finally:
            self._replying = False
            if self._call_states:
                self._call_states.clear()
                self._redraw_calls()
            if self._streamed and not self.closed:
                self._streamed = False
                self._set_streaming(False)
                await self.refresh_context_meter()
                self.on_conversation_changed(self.conversation_id)

    async def continue_reply(self, message_id: int) -> None:
        """Go on with a reply cut at its max tokens, or stopped or interrupted: the same
        message grows, on the same branch, from where it stopped (the local engine reuses the
        cached prefix)."""
        if self.is_streaming or not self._check_backend():
            return
        last = self.views[-1] if self.views else None
        if last is None or last.id != message_id or not last.can_continue:
            self._notify("Only the newest reply, cut at its max tokens or stopped with some "
                         "of its answer written, can be continued.")
            return
        async with self._replying_now():
            message = await self.db.resume_message(message_id)
            await self._run_turn(message, continuing=True)

    async def regenerate_last(self) -> None:
        last = self._last_assistant()
        if last is not None:
            await self.regenerate(last.id)

    async def switch_branch(self, message_id: int, direction: int) -> None:
        if self.is_streaming:
            self._notify(WAIT_TO_SWITCH)
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
        """Stop the reply: at once when it streams, else before it starts streaming; a call
        waiting for the user's answer is not run, a running one is cancelled."""
        if not self.is_streaming:
            return
        self._stop_requested = True
        if self.reply is not None:
            self.view.show_reading(self.reply.message.id, STOPPING)
            if self.reply.backend is not None:
                self.reply.backend.abort(self.reply.request_id)
        self._end_tool_work()

    def answer_tool_call(self, message_id: int, index: int, decision: str) -> None:
        """The user's answer to the call `index` of the reply `message_id`, waiting for it:
        "run", "always" (run, and never ask for this tool again) or "deny". An answer to no
        waiting call is ignored: it came late."""
        if decision not in DECISIONS:
            raise ValueError(f"a call's answer is one of {', '.join(DECISIONS)}, not {decision!r}")
        future = self._decisions.get((message_id, index))
        if future is not None and not future.done():
            future.set_result(decision)  # type: ignore[arg-type]

    def _end_tool_work(self) -> None:
        for future in self._decisions.values():
            if not future.done():
                future.set_result("stop")
        if self._running_call is not None:
            self._running_call.cancel()

    def begin_edit(self, message_id: int) -> None:
        message = next((m for m in self.path if m.id == message_id), None)
        if message is not None and not self.is_streaming:
            self.view.begin_edit(message_id, message.content)

    def use_source(self, source: BackendSource) -> bool:
        """Answer this chat's next replies from `source`; refused (False) while one streams."""
        if self.is_streaming:
            self._notify("Wait for the reply to finish (or stop it) to change where this chat's "
                         "replies come from.")
            return False
        self.source = source
        self.spawn(self.refresh_context_meter())
        return True

    def _last_assistant(self) -> Message | None:
        return next((m for m in reversed(self.path) if m.role == "assistant"), None)

    def unable_to_send(self) -> str | None:
        """Why a message cannot be sent now, in words (a model loading, none loaded, a server's
        key lost); None when it can. Asked again whenever the source's state changes, the
        same question a send asks, so the two never disagree."""
        try:
            self.source.backend_for_new_request()
        except ModelLoadingError as exc:
            return str(exc)
        return None

    def _check_backend(self) -> bool:
        try:
            self.source.backend_for_new_request()
        except ModelLoadingError as exc:
            self._notify(str(exc))
            return False
        return True

    # -- generation ------------------------------------------------------------------------------

    async def _generate(self, parent_id: int) -> None:
        if self.closed:
            return
        message = await self._start_reply(parent_id)
        await self._run_turn(message)

    async def _start_reply(self, parent_id: int) -> Message:
        return await self.db.start_assistant_message(self.conversation_id, parent_id=parent_id,
                                                     model=self._model_name())

    async def _run_turn(self, message: Message, continuing: bool = False) -> None:
        """Write the reply; while it ends calling tools, answer the calls (asking the user) and
        write the next reply from their results. After the turn's most calls the model answers
        without tools."""
        calls_left = self.tools.max_calls_per_turn if self.tools is not None else 0
        while True:
            await self._write_reply(message, continuing, with_tools=calls_left > 0)
            calls = self._calls_to_answer(message.id)
            if not calls:
                return
            parent = await self._answer_calls(message.id, calls, calls_left)
            calls_left = max(0, calls_left - len(calls))
            if parent is None or self.closed or self._stop_requested:
                return
            message, continuing = await self._start_reply(parent), False

    def _calls_to_answer(self, message_id: int) -> tuple[ToolCall, ...]:
        last = self.path[-1] if self.path else None
        if (self.tools is None or self.closed or self._stop_requested or last is None
                or last.id != message_id or last.finish_reason != "tool_calls"):
            return ()
        return last.tool_calls

    async def _answer_calls(self, message_id: int, calls: tuple[ToolCall, ...],
                            calls_left: int) -> int | None:
        """Run (or deny) each call in turn, its result stored under the previous one; the last
        result's id, or None where the user stopped the turn before a call was answered."""
        parent = message_id
        for i, call in enumerate(calls):
            if i >= calls_left:
                ended = "denied", over_the_limit(self.tools.max_calls_per_turn)
            else:
                ended = await self._decide_and_run((message_id, i), call)
            if ended is None or self.closed:
                return None
            result = await self.db.append_tool_message(parent, call, ended[1], ended[0])
            parent = result.id
            self._call_states.pop((message_id, i), None)
            await self._reload()
            if self._stop_requested:
                return None
        return parent

    async def _decide_and_run(self, key: CallKey, call: ToolCall) -> tuple[str, str] | None:
        """(outcome, what the model is told), or None: stopped while the user was asked."""
        if not self.tools.always_allowed(call.name):
            decision = await self._ask(key)
            if decision == "stop":
                return None
            if decision == "deny":
                return "denied", DENIED
            if decision == "always":
                self.tools.allow_always(call.name)
        self._show_call_state(key, "running")
        task = asyncio.ensure_future(self.tools.call(call.name, call.arguments))
        self._running_call = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._running_call = None
        if task.cancelled():
            return "failed", STOPPED
        outcome = task.result()
        return outcome.outcome, outcome.text

    async def _ask(self, key: CallKey) -> Decision:
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._decisions[key] = future
        self._show_call_state(key, "asking")
        try:
            return await future
        finally:
            self._decisions.pop(key, None)

    def _show_call_state(self, key: CallKey, state: ToolCallState) -> None:
        self._call_states[key] = state
        self._redraw_calls(key[0])

    def _redraw_calls(self, message_id: int | None = None) -> None:
        """Show where the calls of `message_id` (None: of every reply shown) stand now."""
        if self.closed:
            return
        outcomes = call_outcomes(self.path)
        messages = {m.id: m for m in self.path if m.tool_calls}
        for i, v in enumerate(self.views):
            m = messages.get(v.id)
            if m is None or message_id not in (None, v.id):
                continue
            view = replace(v, tool_calls=call_views(m, outcomes, self._call_states, self.tools))
            if view != v:
                self.views[i] = view
                self.view.update_message(view)

    async def _write_reply(self, message: Message, continuing: bool = False, *,
                           with_tools: bool = False) -> None:
        """Stream the reply into `message`: a new, empty one, or (`continuing`) one cut at its
        max tokens, which grows; `with_tools`: the chat's tools are offered to the model."""
        writer = StreamingWriter(self.db.store, message.id, text=message.content)
        self.reply = Reply(message, f"conv{self.conversation_id}-msg{message.id}", writer,
                           text=message.content, continuing=continuing)
        self._streamed = True
        self._set_streaming(True)
        try:
            await self._reload(streaming=message.id)
            if self.closed:
                return  # closed while the branch was read: kept interrupted below
            tools = await self._tool_specs() if with_tools else ()
            backend, fitted = await self._fit_on_current_backend(tools)
            if fitted is not None and self._stop_requested:
                await self._keep_stopped(None, "")  # stopped before it began: kept, empty
            elif fitted is not None and not self.closed:
                await self._stream(backend, fitted, tools)
        except BackendError as exc:
            await self._end_on_error(exc)
        finally:
            self.reply = None
            if self.closed:  # closed at any await above: the reply is kept, interrupted
                self.db.submit(lambda _store: writer.closed or writer.interrupt())
            else:
                await self._reload(ending=message.id)

    def _model_name(self) -> str:
        backend = self.source.backend
        return backend.model_name if backend is not None else ""

    async def _fit_on_current_backend(self, tools: tuple[ToolSpec, ...] = (),
                                      ) -> tuple[ChatBackend, FittedPrompt | None]:
        """The backend to stream on and the prompt fitted to it, fitted again when the model was
        switched meanwhile. Raises ModelLoadingError once a model is loading."""
        while True:
            backend = self.source.backend_for_new_request()
            try:
                fitted = await self._fit_prompt(backend, tools)
            except BackendError:
                if self.source.backend_for_new_request() is backend:
                    raise
                continue  # the backend stopped as the model was switched: fit to the new one
            if fitted is None or self.source.backend_for_new_request() is backend:
                return backend, fitted

    async def _stream(self, backend: ChatBackend, fitted: FittedPrompt,
                      tools: tuple[ToolSpec, ...]) -> None:
        # A switch can still come while the backend tokenizes the chat: the stream then ends
        # with "abort" or raises BackendStoppedError, and the tab says the model was switched.
        reply = self.reply
        self._show_prompt_usage(backend, fitted)
        options = sampling_options(self.conversation.sampling, fitted.max_tokens, tools=tools,
                                   thinking_switch=backend.thinking_switch)
        view = message_view(reply.message)
        self.view.begin_stream(view)
        self.views = [*self.views, view]
        reply.backend = backend
        extra = {"continue_final_message": True} if reply.continuing else {}
        async for chunk in backend.stream(fitted.messages, options, reply.request_id,
                                          cache_tag=chat_cache_tag(self.conversation_id),
                                          **extra):
            self._on_chunk(chunk)
        await self._finish(backend.model_name)

    async def _tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tools this chat turned on, as the model is shown them (servers start here)."""
        selectors = self.conversation.sampling.tools
        if self.tools is None or not selectors:
            return ()
        self.view.show_reading(self.reply.message.id, "starting this chat's tools…")
        offer = await self.tools.offer(selectors)
        self.view.show_reading(self.reply.message.id, None)
        if offer.problems:
            self._notify("Some of this chat's tools are left out of this reply: "
                         + "; ".join(offer.problems), error=True)
        self._offered = (selectors, offer.specs)
        return offer.specs

    def _tools_in_prompt(self) -> tuple[ToolSpec, ...]:
        """The tools the last reply offered, while the chat still has them on (the meter counts
        them without starting any server)."""
        selectors, specs = self._offered
        return specs if self.conversation.sampling.tools == selectors else ()

    def _show_prompt_usage(self, backend: ChatBackend, fitted: FittedPrompt) -> None:
        """The meter shows what this reply reads, as soon as it is counted: a long paste is
        seen filling the context while it is read, not once the reply is done."""
        self._meter_counts += 1  # a count still on its way is older than this one
        self.context_usage = (fitted.prompt_tokens, backend.max_model_len,
                              self.conversation.sampling.max_tokens)
        self.view.show_context_usage(*self.context_usage,
                                     exact=fitted.exact and backend.max_model_len_known)

    async def _fit_prompt(self, backend: ChatBackend,
                          tools: tuple[ToolSpec, ...]) -> FittedPrompt | None:
        # The branch without the reply being written; a reply being continued is kept, as the
        # text the model goes on from.
        branch = self.path if self.reply.continuing else self.path[:-1]
        shaped = await self._with_documents(backend, branch, tools)
        messages = shaped.messages
        max_model_len = backend.max_model_len
        if shaped.citations and not self.reply.continuing:
            await self.db.set_sources(self.reply.message.id, shaped.citations)
        self.reply.documents = shaped.has_documents
        try:
            fitted = await fit_to_context(messages,
                                          lambda kept: backend.count_tokens(kept, tools),
                                          max_model_len,
                                          self.conversation.sampling.max_tokens)
        except ContextOverflowError as exc:
            await self._fail(str(exc))
            return None
        if fitted.num_dropped:
            dropped = ("the oldest message was" if fitted.num_dropped == 1
                       else f"the {fitted.num_dropped} oldest messages were")
            self._notify(
                f"This chat is longer than the model's context ({max_model_len:,} "
                f"tokens): {dropped} left out of what the model sees for this reply. They "
                "stay in the chat.")
        return fitted

    async def _with_documents(self, backend: ChatBackend, branch: list[Message],
                              tools: tuple[ToolSpec, ...]) -> DocumentPrompt:
        """The branch as the model is given it, with the branch's documents (and the chat's
        folders', looked at again first)."""
        await self._folders_ready()
        messages = chat_messages(self.conversation.system_prompt, branch)
        return await self.documents.prompt(messages, branch, backend.count_tokens, tools,
                                           backend.max_model_len,
                                           self.conversation.sampling.max_tokens)

    async def _folders_ready(self) -> None:
        """The folders looked at again before the reply, and the few files changed since
        read; where a folder is still being indexed, the notice says the answer comes from what
        is indexed so far."""
        if not self.folders.views:
            return
        self.view.show_reading(self.reply.message.id, READING_FOLDERS)
        try:
            busy = await self.folders.before_question()
        finally:
            self.view.show_reading(self.reply.message.id, None)
        if busy and not self.closed:
            verb = "is" if len(busy) == 1 else "are"
            self._notify(f"{', '.join(busy)} {verb} still being indexed: this answer comes from "
                         "the files indexed so far.")

    def _on_chunk(self, chunk: ReplyChunk) -> None:
        reply = self.reply
        delta = chunk.delta_text
        reply.last_chunk = chunk
        if self.closed or self._stop_requested:
            # After Stop the reply stays as the user saw it when they pressed it; what the
            # backend wrote before it heard is neither drawn nor kept, so a backlog of chunks
            # (three tabs streaming) does not hold the stop up.
            return
        if chunk.prompt_progress is not None:
            reply.reading = reading_text(chunk.prompt_progress, reply.continuing,
                                         reply.documents)
            self.view.show_reading(reply.message.id, reply.reading)
        if chunk.delta_reasoning:
            self._on_reasoning(chunk.delta_reasoning)
        if not delta:
            return
        self._end_reading()
        reply.text += delta
        self.view.append_delta(reply.message.id, delta)
        # Not awaited: the worker applies writes in order, and the stream need not wait for disk.
        self.db.submit(lambda _store, d=delta: reply.writer.append(d))

    def _end_reading(self) -> None:
        """The reply writes: what it was reading is no longer said."""
        reply = self.reply
        if reply.reading is not None:
            reply.reading = None
            self.view.show_reading(reply.message.id, None)

    def _on_reasoning(self, delta: str) -> None:
        reply = self.reply
        self._end_reading()
        reply.reasoning += delta
        self.view.append_reasoning(reply.message.id, delta)
        self.db.submit(lambda _store, d=delta: reply.writer.append_reasoning(d))

    async def _finish(self, model: str) -> None:
        reply = self.reply
        last = reply.last_chunk
        if self.closed:
            return
        if last is not None and last.tool_calls:
            calls = stored_calls(last.tool_calls)
            self.db.submit(lambda _store: reply.writer.set_tool_calls(calls))
        if last is not None and last.finish_reason == "abort" and self._stop_requested \
                and not self._backend_was_switched():
            await self._keep_stopped(last, model)
        elif last is None or last.finish_reason in (None, "abort"):
            await self._keep_interrupted()
        else:
            await self.db.run(lambda _store: reply.writer.finish(
                last.finish_reason, _generation_stats(last, model),
                prompt_tokens=last.num_prompt_tokens, completion_tokens=_written(reply, last)))

    async def _fail(self, error: str) -> None:
        writer = self.reply.writer
        await self.db.run(lambda _store: writer.closed or writer.fail(error))
        if not self.closed:
            self._notify(error, error=True)

    async def _end_on_error(self, exc: BackendError) -> None:
        """A reply cut by a model switch is kept, and said so; one cut by a failure after text
        arrived is kept too, with the failure shown; one that never began fails."""
        if self._backend_was_switched():
            await self._keep_interrupted()
        elif exc.partial_text or self.reply.text or self.reply.reasoning:
            await self._keep_interrupted()
            if not self.closed:
                self._notify(str(exc), error=True)
        else:
            await self._fail(str(exc))

    async def _keep_stopped(self, last: ReplyChunk | None, model: str) -> None:
        """The user's Stop: kept as "stopped", with the figures the backend gave for it."""
        writer = self.reply.writer
        stats = _generation_stats(last, model) if last is not None else None
        await self.db.run(lambda _store: writer.closed or writer.interrupt(
            "stopped", stats, prompt_tokens=last and last.num_prompt_tokens,
            completion_tokens=last and _written(self.reply, last)))

    async def _keep_interrupted(self) -> None:
        """Keep the reply so far; say why when it was not the user's Stop."""
        writer = self.reply.writer
        await self.db.run(lambda _store: writer.closed or writer.interrupt())
        if self._backend_was_switched() and not self.closed:
            self._notify(MODEL_SWITCHED, error=True)

    def _backend_was_switched(self) -> bool:
        backend = self.reply.backend
        return backend is not None and backend is not self.source.backend

    # -- what the view shows ---------------------------------------------------------------------

    def notify(self, text: str) -> None:
        """Tell the user something about this chat in its notice (kept until dismissed)."""
        self._notify(text)

    def _notify(self, text: str, error: bool = False) -> None:
        self.notice = (text, error)
        self.view.show_notice(text, error)

    def clear_notice(self) -> None:
        self.notice = None

    def _set_title(self, title: str) -> None:
        self.title = title
        self.view.show_title(title)

    def _set_can_regenerate(self) -> None:
        self.can_regenerate = self._last_assistant() is not None and not self.is_streaming
        self.view.show_can_regenerate(self.can_regenerate)

    def _set_streaming(self, streaming: bool) -> None:
        self.view.show_streaming(streaming)
        self._set_can_regenerate()
        self.on_streaming_changed(streaming)

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop for good: abort a streaming reply and queue its ending as interrupted on the
        store's worker (the window drains the worker before the app exits)."""
        self.closed = True
        self.view = NullView()  # its widgets may be gone by the time a stream ends
        self._end_tool_work()
        self.folders.close()
        self.documents.close()
        reply = self.reply
        if reply is None:
            return
        if reply.backend is not None:
            reply.backend.abort(reply.request_id)
        writer = reply.writer
        self.db.submit(lambda _store: writer.closed or writer.interrupt())


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
