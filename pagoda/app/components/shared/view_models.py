"""Plain data the widgets render: built by controllers from the store and the engine, never by widgets."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Literal

from pagoda.app.store import SamplingSettings

Role = Literal["system", "user", "assistant", "tool"]
MessageStatus = Literal["complete", "streaming", "interrupted", "error"]
# Where a call of the model's stands: waiting for the user's Run or Deny, running, done,
# denied, failed, or never run (the turn was stopped, or ended at its most calls).
ToolCallState = Literal["asking", "running", "done", "denied", "failed", "not run"]


@dataclass(slots=True, frozen=True)
class ToolCallView:
    """A call a reply made, as its message shows it: the function, the JSON arguments the model
    wrote, where the call stands, and the MCP server it goes to (None: no server has it now)."""

    id: str
    name: str
    arguments: str
    state: ToolCallState
    server: str | None = None


@dataclass(slots=True, frozen=True)
class ToolServerView:
    """An MCP server as a chat's settings offer it: its name, its tools (name, description),
    and where it stands in words ("running", "not started", "failed: …")."""

    name: str
    tools: tuple[tuple[str, str], ...] = ()
    state: str = ""


@dataclass(slots=True, frozen=True)
class AttachmentView:
    """A document on a user's message, or waiting in the composer: its name, what it is, and
    where it stands ("reading" with `progress` in words, "ready", or "failed" with `error`)."""

    name: str
    kind: str = ""
    size_bytes: int = 0
    pages: int | None = None
    state: Literal["reading", "ready", "failed"] = "ready"
    progress: str = ""  # "page 40 / 200"
    error: str = ""


FolderState = Literal["scanning", "indexing", "ready", "failed"]


@dataclass(slots=True, frozen=True)
class ImageView:
    """An image on a user's message, or waiting in the composer: its name, type and size, and
    its bytes (the widget makes its thumbnail and its full view from them)."""

    name: str
    mime_type: str
    width: int
    height: int
    data: bytes = field(repr=False)


@dataclass(slots=True, frozen=True)
class FolderView:
    """A folder a chat answers from, as its chip shows it: the files found in it and how many
    are indexed, the reading under way (`done` of `to_read`), the files that could not be read
    (their path in the folder, and why), what the bounds left out (`notes`, in words), and why
    the folder cannot be looked in ("failed", `error`)."""

    id: int
    name: str
    path: str
    state: FolderState = "scanning"
    files: int = 0
    indexed: int = 0
    done: int = 0
    to_read: int = 0
    failed: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    error: str = ""


@dataclass(slots=True, frozen=True)
class SourceView:
    """A passage a reply was given, as it cites it: "[1] report.pdf, p. 12"; the heading it is
    under and its place in the document (`ordinal`) tell apart passages of one file."""

    number: int
    name: str
    page: int | None = None
    heading: str | None = None
    ordinal: int = 0


@dataclass(slots=True, frozen=True)
class PassageView:
    """A cited passage opened from a reply: where it is and its text."""

    name: str
    page: int | None
    heading: str | None
    text: str


@dataclass(slots=True, frozen=True)
class MessageView:
    """One message of the branch on screen, with what the transcript shows around it."""

    id: int
    role: Role
    content: str
    created_at: datetime
    status: MessageStatus = "complete"
    sibling_index: int = 0  # 0-based position among its siblings (the `< 2/3 >` switcher)
    sibling_count: int = 1
    stats_text: str = ""  # e.g. "38.2 tok/s · TTFT 0.21 s · 112 cached"
    error: str | None = None
    # Why a reply ended: "stop", "length" (cut at max tokens), "stopped" (the user's Stop;
    # status "interrupted"), None while streaming or when cut by closing, a switch or a failure.
    finish_reason: str | None = None
    completion_tokens: int | None = None
    # An assistant's reasoning (None: it gave none) and how long it took (None while it goes on).
    reasoning: str | None = None
    reasoning_s: float | None = None
    tool_calls: tuple[ToolCallView, ...] = ()
    max_tokens: int | None = None  # a reply cut at its max tokens: the chat's max tokens
    # A tool message: the function whose result `content` is; its outcome is `finish_reason`
    # ("done", "denied" or "failed").
    tool_name: str | None = None
    attachments: tuple[AttachmentView, ...] = ()  # a user's message: the documents it brought
    images: tuple[ImageView, ...] = ()  # a user's message: the images it brought
    sources: tuple[SourceView, ...] = ()  # a reply: the passages it was given to answer from

    @property
    def can_continue(self) -> bool:
        """A reply that can go on where it ended: cut at its max tokens, or stopped or
        interrupted once some of its answer was written (not one that called tools)."""
        if self.role != "assistant" or self.tool_calls:
            return False
        if self.status == "complete":
            return self.finish_reason == "length"
        return self.status == "interrupted" and bool(self.content)


def _with_fields_of(source: type):
    """A class decorator, put under @dataclass: the fields of the dataclass `source`, at its
    defaults, after the class's own (as if written out again)."""

    def add_fields(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        cls.__annotations__ = {**own, **{f.name: f.type for f in fields(source)}}
        defaults = source()
        for f in fields(source):
            setattr(cls, f.name, getattr(defaults, f.name))
        return cls

    return add_fields


@dataclass(slots=True, frozen=True)
@_with_fields_of(SamplingSettings)
class SamplingView:
    """The per-conversation settings the side panel edits: the system prompt, then every field
    of the stored SamplingSettings, flattened for the widgets (defaults are the store's)."""

    system_prompt: str = ""

    @classmethod
    def of(cls, system_prompt: str | None, sampling: SamplingSettings) -> SamplingView:
        return cls(system_prompt=system_prompt or "", **asdict(sampling))

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(**{f.name: getattr(self, f.name) for f in fields(SamplingSettings)})


@dataclass(slots=True, frozen=True)
class LoadStepView:
    """How far a model's load has got: step `number` of `steps`, what it does (`words`), and
    the share of that step done where the step has a measure."""

    words: str
    number: int
    steps: int
    fraction: float | None = None

    @property
    def share(self) -> float:
        """Of the whole load, counting each step as an equal part."""
        return (self.number - 1 + (self.fraction or 0.0)) / self.steps


@dataclass(slots=True, frozen=True)
class EngineStatusView:
    """What the status bar shows, refreshed a few times a second."""

    state: Literal["loading", "ready", "error"]
    device: str
    model: str = ""
    detail: str = ""  # error message
    load: LoadStepView | None = None  # while loading: the step under way
    num_running: int = 0
    num_waiting: int = 0
    tokens_per_s: float = 0.0
    kv_cache_usage: float = 0.0  # 0..1
    prefix_cache_hit_rate: float = 0.0  # 0..1
    spec_acceptance_rate: float | None = None  # 0..1; None while speculative decoding is off
    spec_status: str | None = None  # "drafts off: 13% accepted"
    spec_reason: str | None = None  # the same, and what verifying costs here
    resident_bytes: int | None = None  # this process's RAM in use now; None where unknown


@dataclass(slots=True, frozen=True)
class LocalServerView:
    """What the settings and the status bar show of the local API server."""

    port: int
    address: str | None = None  # e.g. "http://127.0.0.1:8000" while it serves; None when off
    running_requests: int = 0
    error: str = ""  # why it is off, when it failed to start
    key_set: bool = False
