"""One API request's choices run on the engine: started, streamed or collected, and counted."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Protocol

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from pagoda.engine.errors import EngineDeadError
from pagoda.engine.multimodal.images import DecodedImage
from pagoda.engine.outputs import PromptProgress, RequestOutput
from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.server.admission import WorkBudget, choice_work
from pagoda.engine.server.errors import APIError, as_api_errors, from_engine_error
from pagoda.engine.server.metrics import ServerMetrics
from pagoda.engine.server.served import ServedModel
from pagoda.engine.server.streams import merge, peek, tagged, until_disconnected

# Finish reasons the API knows; an engine abort (a shutdown) is reported as such.
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass(slots=True)
class Choice:
    prompt: list[int]  # encoded by the endpoint, so admission can count it
    params: SamplingParams
    prompt_index: int = 0  # which prompt of a batch (completions), for usage
    images: tuple[DecodedImage, ...] = ()  # the chat's images, in the order of their placeholders


class ReplyEnd(Protocol):
    """Reads a choice's text as it comes and says when the reply is over before the engine
    would end it (pagoda/engine/parsers/repeated_calls.py)."""

    repeated: bool

    def feed(self, text: str) -> str: ...


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def finish_reason(out: RequestOutput) -> str | None:
    completion = out.outputs[0]
    if completion.finish_reason == "error":
        raise APIError(500, f"generation failed: {completion.error}", code="generation_failed")
    return _FINISH.get(completion.finish_reason) if completion.finish_reason else None


def usage(finals: list[RequestOutput], choices: list[Choice]) -> dict:
    """OpenAI's usage block: each prompt counted once, however many choices it has."""
    first_of_prompt = {}
    for out, choice in zip(finals, choices, strict=True):
        first_of_prompt.setdefault(choice.prompt_index, out)
    prompt_tokens = sum(len(out.prompt_token_ids) for out in first_of_prompt.values())
    cached = sum(out.num_cached_tokens for out in first_of_prompt.values())
    completion_tokens = sum(len(out.outputs[0].token_ids) for out in finals)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}


def prompt_progress(progress: PromptProgress) -> dict:
    """How far the prompt is read, in llama.cpp's `prompt_progress` shape (asked for with
    `return_progress`), so its clients read ours as well: tokens in all, found cached, computed
    so far (cached ones included), and milliseconds since the request was scheduled."""
    return {"total": progress.num_prompt_tokens, "cache": progress.num_cached_tokens,
            "processed": progress.num_computed_tokens,
            "time_ms": round(progress.elapsed * 1000)}


def item_id(prefix: str) -> str:
    """An id in the underscored form of OpenAI's Responses and Anthropic's Messages (resp_...,
    msg_...)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def sse_event(event: dict) -> str:
    """A typed event, named by its `type` (the Responses' and Messages' streams)."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


class Generation:
    """Runs `choices` for one request id, once `budget` admits their work; `prompt_field` names
    the prompt in error messages."""

    def __init__(self, served: ServedModel, metrics: ServerMetrics, budget: WorkBudget,
                 choices: list[Choice], request_id: str, prompt_field: str) -> None:
        self.served = served
        self.metrics = metrics
        self.budget = budget
        self.choices = choices
        self.request_id = request_id
        self.created = int(time.time())
        self._prompt_field = prompt_field
        self._events: AsyncIterator[tuple[int, RequestOutput]] | None = None
        self._ends: list[ReplyEnd | None] = [None] * len(choices)
        self._ended_early: set[int] = set()

    def end_when(self, make: Callable[[], ReplyEnd | None]) -> None:
        """Watch each choice with its own `make()`: once it says the reply is over, the choice
        is aborted on the engine and ends as stopped ("stop"), with what it wrote until then."""
        self._ends = [make() for _ in self.choices]

    async def check_constraint(self, field: str, request: Request) -> None:
        """Compile the choices' constraint (they share one) before anything runs, so one that
        cannot be compiled, or not within the engine's deadline, is a 400 naming `field`; the
        streams then find it compiled. A client that leaves meanwhile stops its compile."""
        try:
            await until_disconnected(
                request, lambda: self.served.backend.compile_grammar(self.choices[0].params))
        except ValueError as exc:
            raise APIError(400, f"{field}: {exc}", param=field) from exc
        except EngineDeadError as exc:  # the server is stopping
            raise from_engine_error(exc, self._prompt_field) from exc

    async def start(self) -> None:
        """Submit every choice and wait for the first output, so a request the engine refuses
        becomes an error response rather than a broken stream."""
        streams = [
            self.served.backend.stream(choice.prompt, choice.params, f"{self.request_id}-{i}",
                                       images=choice.images)
            for i, choice in enumerate(self.choices)
        ]
        # One choice (nearly every request) is read directly: no task or queue per token.
        merged = self._admitted(
            self._counted(merge(streams) if len(streams) > 1 else tagged(streams[0])))
        try:
            with as_api_errors(self._prompt_field):
                _, self._events = await peek(merged)
        except StopAsyncIteration:
            raise APIError(500, "the engine returned no output") from None

    async def events(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Every output of every choice, as it comes; engine failures become APIError."""
        try:
            with as_api_errors(self._prompt_field):
                async for index, out in self._events:
                    yield index, self._watched(index, out)
        finally:
            await self._events.aclose()

    def _watched(self, index: int, out: RequestOutput) -> RequestOutput:
        """`out`, after its choice's watcher read it: the choice aborted where the watcher says
        its reply is over, and the abort's last output reported as a stop."""
        completion = out.outputs[0]
        if index in self._ended_early:
            if completion.finish_reason != "abort":
                return out
            return replace(out, outputs=[replace(completion, finish_reason="stop")])
        end = self._ends[index]
        if end is None or out.finished:
            return out
        end.feed(completion.delta_text)
        if end.repeated:
            self._ended_early.add(index)
            self.served.backend.abort(f"{self.request_id}-{index}")
        return out

    async def collect(self, request: Request) -> list[RequestOutput]:
        """The final output of each choice; the client leaving aborts them all."""
        async def gather() -> list[RequestOutput]:
            finals: list[RequestOutput | None] = [None] * len(self.choices)
            async for index, out in self.events():
                if out.finished:
                    finals[index] = out
            return finals
        return await until_disconnected(request, gather)

    def work(self) -> int:
        """The tokens of work the choices may cost (see pagoda.engine.server.admission)."""
        limit = self.served.max_model_len
        return sum(choice_work(len(c.prompt), c.params.max_tokens, limit) for c in self.choices)

    async def _admitted(self, outputs: AsyncIterator[tuple[int, RequestOutput]],
                        ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """`outputs` once the budget admits the work (nothing reaches the engine before), which
        is held until they end: finished, failed, or closed when the client left (a stream that
        is never read is closed when it is collected)."""
        admission = self.budget.admit(self.work(), self.served.max_model_len)
        try:
            async for item in outputs:
                yield item
        finally:
            admission.release()
            await outputs.aclose()

    async def _counted(self, merged: AsyncIterator[tuple[int, RequestOutput]],
                       ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """The outputs, each choice counted in the metrics when it ends: at its last output, or
        with what it had when the client left ("abort") or the engine failed ("error")."""
        last: dict[int, RequestOutput] = {}
        ended = "abort"
        try:
            async for index, out in merged:
                last[index] = out
                if out.finished:
                    self.metrics.observe_finished(out)
                yield index, out
        except Exception:
            ended = "error"
            raise
        finally:
            self.metrics.observe_cut_short(
                [out for out in last.values() if not out.finished], ended)
            await merged.aclose()


# (choice index, its output, its finish reason) -> the chunk that sends what is new in it, or
# None when nothing can be sent yet (a tool call's tag not yet whole).
ChunkOf = Callable[[int, RequestOutput, str | None], dict | None]


async def sse_events(generation: Generation, chunk_of: ChunkOf,
                     usage_chunk: Callable[[dict], dict] | None,
                     return_progress: bool = False) -> AsyncIterator[str]:
    """A streamed reply: one `data:` chunk per choice's new text or finish, the usage chunk when
    asked for, and `data: [DONE]`. With `return_progress`, a prompt read in several chunks sends
    an empty chunk with its `prompt_progress` after each. An engine failure mid-stream is sent
    as an error chunk."""
    finals: list[RequestOutput | None] = [None] * len(generation.choices)
    try:
        async for index, out in generation.events():
            completion = out.outputs[0]
            reason = finish_reason(out)
            if out.finished:
                finals[index] = out
            if completion.delta_text or completion.delta_logprobs or reason:
                payload = chunk_of(index, out, reason)
                if payload is not None:
                    yield sse(payload)
            elif return_progress and out.prompt_progress is not None:
                yield sse({**chunk_of(index, out, None),
                           "prompt_progress": prompt_progress(out.prompt_progress)})
    except APIError as exc:
        yield sse(exc.body())
    else:
        if usage_chunk is not None:
            yield sse(usage_chunk(usage(finals, generation.choices)))
    yield sse("[DONE]")


async def respond(generation: Generation, request: Request, stream: bool,
                  chunks: Callable[[], AsyncIterator[str]],
                  whole: Callable[[list[RequestOutput]], dict]) -> Response:
    """Start the generation, then answer with SSE chunks or, once all is done, one JSON body."""
    await generation.start()
    if stream:
        return StreamingResponse(chunks(), media_type="text/event-stream")
    return JSONResponse(whole(await generation.collect(request)))
