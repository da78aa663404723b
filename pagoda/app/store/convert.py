"""Between ORM rows and the plain records callers receive. No sessions here."""

import json
from dataclasses import asdict
from datetime import UTC, datetime

from .documents import attachments
from .records import (
    Conversation,
    GenerationStats,
    Message,
    ReplyParts,
    SamplingSettings,
    SearchHit,
    ToolCall,
)
from .schema import ConversationRow, MessageRow
from .search import search


def sampling_json(sampling: SamplingSettings) -> str:
    return json.dumps(asdict(sampling), sort_keys=True)


def sampling_of(text: str) -> SamplingSettings:
    values = json.loads(text)
    if "tools" in values:
        values["tools"] = tuple(values["tools"])
    return SamplingSettings(**values)


def to_conversation(row: ConversationRow, leaf_id: int | None) -> Conversation:
    return Conversation(
        id=row.id,
        title=row.title,
        created_at=row.created_at,
        updated_at=row.updated_at,
        model=row.model,
        system_prompt=row.system_prompt,
        sampling=sampling_of(row.sampling),
        pinned=row.pinned,
        archived=row.archived,
        deleted_at=row.deleted_at,
        leaf_id=leaf_id,
    )


def to_message(row: MessageRow) -> Message:
    return Message(
        id=row.id,
        conversation_id=row.conversation_id,
        parent_id=row.parent_id,
        role=row.role,  # type: ignore[arg-type]
        content=row.content,
        created_at=row.created_at,
        status=row.status,  # type: ignore[arg-type]
        finish_reason=row.finish_reason,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        stats=stats_of(row),
        error=row.error,
        reasoning=row.reasoning,
        reasoning_s=row.reasoning_s,
        tool_calls=tool_calls_of(row.tool_calls),
        tool_call_id=row.tool_call_id,
        tool_name=row.tool_name,
        sources=attachments.sources_of(row.sources),
    )


def apply_parts(row: MessageRow, parts: ReplyParts) -> None:
    row.reasoning = parts.reasoning
    row.reasoning_s = parts.reasoning_s
    row.tool_calls = tool_calls_json(parts.tool_calls)


def tool_calls_json(calls: tuple[ToolCall, ...]) -> str | None:
    """A reply's calls as the column holds them; None for a reply that made none."""
    return json.dumps([asdict(call) for call in calls], ensure_ascii=False) if calls else None


def tool_calls_of(text: str | None) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(**call) for call in json.loads(text)) if text else ()


def stats_of(row: MessageRow) -> GenerationStats | None:
    stats = GenerationStats(row.gen_model, row.ttft_s, row.tokens_per_s, row.cached_tokens)
    return None if stats == GenerationStats() else stats


def apply_stats(row: MessageRow, stats: GenerationStats) -> None:
    if stats.model is not None:
        row.gen_model = stats.model
    row.ttft_s = stats.ttft_s
    row.tokens_per_s = stats.tokens_per_s
    row.cached_tokens = stats.cached_tokens


def to_search_hit(row: tuple, markers: tuple[str, str], escape_html: bool) -> SearchHit:
    cid, title, mid, role, raw_snippet, created_at = row
    if isinstance(created_at, str):  # the FTS query is raw SQL: no type conversion
        created_at = datetime.fromisoformat(created_at).replace(tzinfo=UTC)
    return SearchHit(
        conversation_id=cid,
        conversation_title=title,
        message_id=mid,
        role=role,
        snippet=search.render_snippet(raw_snippet or "", markers, escape_html),
        created_at=created_at,
    )
