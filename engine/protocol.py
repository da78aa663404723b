"""The seam the app depends on: any backend that streams chat replies, aborts and reports stats.

`AsyncEngine` satisfies it in-process; a remote OpenAI-compatible backend can satisfy it later
without the app changing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from engine.chat_template import Message
from engine.llm_engine import EngineStats
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


@runtime_checkable
class ChatBackend(Protocol):
    def stream(self, prompt: str | list[int] | Sequence[Message],
               params: SamplingParams | None = None,
               request_id: str | None = None) -> AsyncIterator[RequestOutput]: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def check_health(self) -> None:
        """Raise (EngineDeadError) when the backend can serve no more requests."""

    def shutdown(self, timeout: float = 10.0) -> None: ...
