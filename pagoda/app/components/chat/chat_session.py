"""One open chat, without a window: its branch, its settings, its title and the notice it
shows, and the user's actions on it. Its turns (replies, tool calls, streaming) are a ChatTurn,
its files (`files`: documents and folders) a ChatFiles, its context meter a ContextMeter; it
tells a `ChatView` what changed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pagoda.app.backends import ModelLoadingError
from pagoda.app.components.chat.branch import load_branch, with_max_tokens
from pagoda.app.components.chat.chat_files import ChatFiles
from pagoda.app.components.chat.context_meter import ContextMeter
from pagoda.app.components.chat.reply_stream import Reply
from pagoda.app.components.chat.seams import BackendSource, ChatView, NullView
from pagoda.app.components.chat.tool_turns import turn_start
from pagoda.app.components.chat.turn import ChatTurn
from pagoda.app.components.images.stored_images import to_new_image
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.tasks import TaskSet
from pagoda.app.components.shared.tool_seam import ChatTools
from pagoda.app.components.shared.view_models import MessageView, SamplingView
from pagoda.app.store import Conversation, ImageRefusedError, Message

logger = logging.getLogger(__name__)

WAIT_TO_SWITCH = "Wait for the reply to finish (or stop it) to switch branches."


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
        self.view: ChatView = view or NullView()
        self.conversation: Conversation | None = None
        self.path: list[Message] = []
        self.views: list[MessageView] = []
        self.title = "New chat"
        self.notice: tuple[str, bool] | None = None
        self.can_regenerate = False
        self.settings = SamplingView()
        self.draft = ""  # the message being typed, counted in the context meter
        self.on_conversation_changed: Callable[[int], None] = lambda _cid: None
        self.on_streaming_changed: Callable[[bool], None] = lambda _streaming: None
        self._tasks = TaskSet(self.action_failed)
        self.stop_requested = False
        self.closed = False
        self.files = ChatFiles(self)
        self.meter = ContextMeter(self)
        self.turn = ChatTurn(self)

    @property
    def reply(self) -> Reply | None:
        return self.turn.stream.reply

    @property
    def context_usage(self) -> tuple[int, int, int] | None:
        return self.meter.usage

    @property
    def is_streaming(self) -> bool:
        """A reply is on its way: from the moment the user's message is being stored until
        the reply has ended. Sending, editing, regenerating and switching wait until then."""
        return self.turn.replying_now or self.reply is not None

    def spawn(self, coro) -> asyncio.Task:
        """Run a coroutine for this chat; a failure is shown in the chat, never lost in a log."""
        return self._tasks.spawn(coro)

    def action_failed(self, exc: BaseException) -> None:
        logger.error("chat %s: %s", self.conversation_id, exc, exc_info=exc)
        if not self.closed:
            self.notify(f"Something went wrong: {exc}", error=True)

    async def wait_idle(self) -> None:
        """Wait for every action started with `spawn` (tests, and closing in order)."""
        await self._tasks.wait_idle()

    # -- loading and settings --------------------------------------------------------------------

    async def open(self) -> None:
        """Show the conversation as stored: its current branch and its settings."""
        await self.reload()
        if self.closed:
            return
        c = self.conversation
        self.settings = SamplingView.of(c.system_prompt, c.sampling)
        self.view.show_settings(self.settings)
        await self.files.folders.open()
        await self.refresh_context_meter()

    async def reload(self, *, streaming: int | None = None, ending: int | None = None) -> None:
        """Re-read the branch and redraw what changed. `streaming` leaves that (new, empty) reply
        out for begin_stream to draw; `ending` is the reply whose stream just ended.
        """
        conversation, path, views = await self.db.run(
            lambda store: load_branch(store, self.conversation_id))
        if self.closed:
            return
        self.conversation, self.path = conversation, path
        views = with_max_tokens(self.turn.with_calls(path, views),
                                conversation.sampling.max_tokens)
        if streaming is not None:
            views = [v for v in views if v.id != streaming]
        self._render(views, ending)
        self._set_title(conversation.title or "New chat")
        self._set_can_regenerate()

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
            self._render(with_max_tokens(self.views, self.conversation.sampling.max_tokens))
        await self.refresh_context_meter()

    async def count_draft(self, text: str) -> None:
        """The message being typed counts in the context meter (the caller debounces), so an
        over-long paste is flagged before it is sent."""
        self.draft = text
        await self.refresh_context_meter()

    async def refresh_context_meter(self) -> None:
        await self.meter.refresh()

    # -- the user's actions ----------------------------------------------------------------------

    async def send(self, text: str) -> None:
        if (self.is_streaming or not self._check_backend() or self.files.still_reading()
                or self.files.images_refused()):
            self.view.restore_draft(text)
            return
        self.draft = ""
        images = self.files.images.take()
        async with self.turn.replying():
            try:
                user = await self.db.append_user_message(
                    self.conversation_id, text, [to_new_image(image) for image in images])
            except ImageRefusedError as exc:
                self.files.images.give_back(images)
                self.draft = text
                self.view.restore_draft(text)
                self.notify(f"This message was not sent: {exc}. Your message and its images "
                            "stay in the box.", error=True)
                return
            await self.files.documents.keep_with(user.id)
            self.on_conversation_changed(self.conversation_id)
            await self.turn.generate(user.id)

    async def edit(self, message_id: int, text: str) -> None:
        if self.is_streaming or not self._check_backend():
            return
        async with self.turn.replying():
            user = await self.db.edit_user_message(message_id, text)
            await self.turn.generate(user.id)

    async def regenerate(self, assistant_id: int) -> None:
        """A new reply to the user's message `assistant_id` answered, beside the old one: a
        turn that called tools is run again from the user's message."""
        if self.is_streaming or not self._check_backend():
            return
        message = next((m for m in self.path if m.id == assistant_id), None)
        if message is None or message.parent_id is None:
            return
        async with self.turn.replying():
            await self.turn.generate(turn_start(self.path, assistant_id) or message.parent_id)

    async def regenerate_last(self) -> None:
        last = self._last_assistant()
        if last is not None:
            await self.regenerate(last.id)

    async def continue_reply(self, message_id: int) -> None:
        """Go on with a reply cut at its max tokens, or stopped or interrupted: the same
        message grows, on the same branch, from where it stopped (the local engine reuses the
        cached prefix)."""
        if self.is_streaming or not self._check_backend():
            return
        last = self.views[-1] if self.views else None
        if last is None or last.id != message_id or not last.can_continue:
            self.notify("Only the newest reply, cut at its max tokens or stopped with some "
                        "of its answer written, can be continued.")
            return
        async with self.turn.replying():
            message = await self.db.resume_message(message_id)
            await self.turn.run(message, continuing=True)

    async def switch_branch(self, message_id: int, direction: int) -> None:
        if self.is_streaming:
            self.notify(WAIT_TO_SWITCH)
            return
        ids = [s.id for s in await self.db.siblings(message_id)]
        await self.show_branch_of(ids[(ids.index(message_id) + direction) % len(ids)])

    async def show_branch_of(self, message_id: int) -> None:
        """Make the branch holding `message_id` the one shown (a search hit on another branch)."""
        if self.is_streaming:
            return
        await self.db.switch_branch(message_id)
        await self.reload()
        await self.refresh_context_meter()

    def stop(self) -> None:
        """Stop the reply: at once when it streams, else before it starts streaming; a call
        waiting for the user's answer is not run, a running one is cancelled."""
        if not self.is_streaming:
            return
        self.stop_requested = True
        self.turn.stream.stop()
        self.turn.end_tool_work()

    def answer_tool_call(self, message_id: int, index: int, decision: str) -> None:
        self.turn.answer(message_id, index, decision)

    def begin_edit(self, message_id: int) -> None:
        message = next((m for m in self.path if m.id == message_id), None)
        if message is not None and not self.is_streaming:
            self.view.begin_edit(message_id, message.content)

    def use_source(self, source: BackendSource) -> bool:
        """Answer this chat's next replies from `source`; refused (False) while one streams."""
        if self.is_streaming:
            self.notify("Wait for the reply to finish (or stop it) to change where this chat's "
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
        reason = self.unable_to_send()
        if reason is not None:
            self.notify(reason)
        return reason is None

    # -- what the view shows ---------------------------------------------------------------------

    def notify(self, text: str, error: bool = False) -> None:
        """Tell the user something about this chat in its notice (kept until dismissed)."""
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

    def set_streaming(self, streaming: bool) -> None:
        self.view.show_streaming(streaming)
        self._set_can_regenerate()
        self.on_streaming_changed(streaming)

    def close(self) -> None:
        """Stop for good: abort a streaming reply and queue its ending as interrupted on the
        store's worker (the window drains the worker before the app exits)."""
        self.closed = True
        self.view = NullView()  # its widgets may be gone by the time a stream ends
        self.turn.end_tool_work()
        self.files.close()
        self.turn.stream.close()
