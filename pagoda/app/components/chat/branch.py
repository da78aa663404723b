"""A chat's branch, root to leaf, as the views a ChatView draws: each message with its place
among its siblings, its documents and images, and its cited sources."""

from __future__ import annotations

from dataclasses import replace

from pagoda.app.components.chat.prompting import stats_text
from pagoda.app.components.documents.chat_documents import attachment_views
from pagoda.app.components.images.stored_images import kept_image_view
from pagoda.app.components.shared.view_models import AttachmentView, MessageView, SourceView
from pagoda.app.store import Conversation, ConversationStore, Message


def message_view(m: Message, sibling_index: int = 0, sibling_count: int = 1,
                 attachments: tuple[AttachmentView, ...] = ()) -> MessageView:
    stats = stats_text(m.stats, m.completion_tokens) if m.role == "assistant" else ""
    return MessageView(id=m.id, role=m.role, content=m.content, created_at=m.created_at,
                       status=m.status, sibling_index=sibling_index, sibling_count=sibling_count,
                       stats_text=stats, error=m.error if m.status == "error" else None,
                       finish_reason=m.finish_reason, completion_tokens=m.completion_tokens,
                       reasoning=m.reasoning, reasoning_s=m.reasoning_s, tool_name=m.tool_name,
                       attachments=attachments,
                       images=tuple(kept_image_view(kept) for kept in m.images),
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


def with_max_tokens(views: list[MessageView], max_tokens: int) -> list[MessageView]:
    """The views with the chat's max tokens on each reply cut at them (its note says them
    where they differ from its length: a reply continued)."""
    return [replace(v, max_tokens=max_tokens) if v.finish_reason == "length" else v
            for v in views]
