"""What a ChatSession needs of its surroundings: where its replies come from (`BackendSource`)
and whoever shows it (`ChatView`: the tab's widgets, or a recording fake in the tests)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pagoda.app.backends import ChatBackend
from pagoda.app.components.shared.view_models import (
    AttachmentView,
    FolderView,
    ImageView,
    MessageView,
    PassageView,
    SamplingView,
)


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
    def show_pending_images(self, views: list[ImageView]) -> None:
        """The images waiting in the composer for the next message."""
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
