"""What a ChatSession's parts use of the session. ChatSession builds its parts (ChatFiles,
ContextMeter, ChatTurn and its ReplyStream), so the parts cannot import it: each names here
what it reads and calls, and one part reaches another only through the methods named here."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from pagoda.app.backends import ChatBackend, ToolSpec
from pagoda.app.components.chat.prompting import FittedPrompt
from pagoda.app.components.chat.seams import BackendSource, ChatView
from pagoda.app.components.documents.chat_documents import ChatDocuments, DocumentPrompt
from pagoda.app.components.images.pending_images import PendingImages
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.tool_seam import ChatTools
from pagoda.app.components.shared.view_models import MessageView
from pagoda.app.store import Conversation, Message


class SessionState(Protocol):
    """What every part reads of its chat: the conversation, its branch, where it is shown,
    and whether the chat was closed."""

    view: ChatView
    conversation: Conversation | None
    path: list[Message]
    closed: bool


class FilesHost(SessionState, Protocol):
    """What ChatFiles uses: the chat's store, its notice, its tasks, the meter it redraws, and
    the backend in service (whether it takes the composer's images)."""

    conversation_id: int
    db: AsyncStore
    source: BackendSource

    def notify(self, text: str, error: bool = False) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task: ...
    def action_failed(self, exc: BaseException) -> None: ...
    async def refresh_context_meter(self) -> None: ...


class ComposerFiles(Protocol):
    """The files the meter counts: the documents and images waiting in the composer."""

    documents: ChatDocuments
    images: PendingImages


class OfferedTools(Protocol):
    """The tools the meter counts in the prompt."""

    def tools_in_prompt(self) -> tuple[ToolSpec, ...]: ...


class MeterHost(SessionState, Protocol):
    """What ContextMeter counts: the draft, the files and tools the next prompt holds, with
    the tokenizer of the backend in service."""

    source: BackendSource
    draft: str
    files: ComposerFiles
    turn: OfferedTools

    @property
    def is_streaming(self) -> bool: ...


class PromptFiles(Protocol):
    """The chat's files as a reply's prompt takes them."""

    async def prompt(self, backend: ChatBackend, branch: list[Message],
                     tools: tuple[ToolSpec, ...], message_id: int) -> DocumentPrompt: ...


class PromptMeter(Protocol):
    """The meter a reply shows its prompt on, as soon as it is counted."""

    def show_prompt(self, backend: ChatBackend, fitted: FittedPrompt) -> None: ...


class StreamingTurn(Protocol):
    """The turn a reply tells when its stream begins."""

    def begin_streaming(self) -> None: ...


class StreamHost(SessionState, Protocol):
    """What ReplyStream uses: the store it writes to, the views it grows, the user's Stop,
    the parts a prompt needs."""

    conversation_id: int
    db: AsyncStore
    source: BackendSource
    views: list[MessageView]
    stop_requested: bool
    files: PromptFiles
    meter: PromptMeter
    turn: StreamingTurn

    def notify(self, text: str, error: bool = False) -> None: ...
    async def reload(self, *, streaming: int | None = None,
                     ending: int | None = None) -> None: ...


class TurnHost(StreamHost, Protocol):
    """What ChatTurn uses (and hands its ReplyStream): the chat's tools, its streaming state,
    and whoever refreshes the chat list."""

    tools: ChatTools | None

    def set_streaming(self, streaming: bool) -> None: ...
    def on_conversation_changed(self, conversation_id: int) -> None: ...
    async def refresh_context_meter(self) -> None: ...
