"""POST /v1/completions: OpenAI's text completion of a prompt (text or token ids, or a batch)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request

from pagoda.engine.outputs import RequestOutput, TokenLogprobs
from pagoda.engine.server.admission import WorkBudget
from pagoda.engine.server.errors import APIError, as_api_errors
from pagoda.engine.server.generation import (
    Choice,
    Generation,
    finish_reason,
    new_id,
    respond,
    sse_events,
    usage,
)
from pagoda.engine.server.logprobs import completion_logprobs
from pagoda.engine.server.metrics import ServerMetrics
from pagoda.engine.server.protocol import CompletionRequest, check_choices
from pagoda.engine.server.served import ServedModel


async def create_completion(body: CompletionRequest, request: Request, served: ServedModel,
                            metrics: ServerMetrics, budget: WorkBudget):
    body.check_supported()
    prompts = body.prompts()
    if not prompts:
        raise APIError(400, "prompt is empty: give a text or a list of token ids", param="prompt")
    check_choices(len(prompts), body.n)
    # Choice i*n+j is the j-th completion of prompt i, as OpenAI numbers them.
    with as_api_errors("prompt"):
        token_ids = [await _tokens(prompt, served) for prompt in prompts]
        choices = [Choice(ids, body.sampling_params(body.resolved_max_tokens(), j), i)
                   for i, ids in enumerate(token_ids) for j in range(body.n)]
    generation = Generation(served, metrics, budget, choices, new_id("cmpl"), "prompt")
    constraint = body.constraint()
    if constraint is not None:
        await generation.check_constraint(constraint[0], request)
    echo = _Echo(served, prompts, token_ids) if body.echo else None
    return await respond(generation, request, body.stream,
                         lambda: _chunks(generation, echo, body.include_usage,
                                         body.return_progress),
                         lambda finals: _completion(generation, echo, finals))


class _Echo:
    """The prompts said again before their completions (`echo`), with their logprobs when the
    request asks for logprobs: each prompt's text as sent (token ids spelled out)."""

    def __init__(self, served: ServedModel, prompts: list[str | list[int]],
                 token_ids: list[list[int]]) -> None:
        self._texts = [p if isinstance(p, str) else served.backend.token_text(p)
                       for p in prompts]
        self._first_tokens = [served.backend.token_text(ids[:1]) for ids in token_ids]

    def text(self, choice: Choice) -> str:
        return self._texts[choice.prompt_index]

    def logprobs(self, choice: Choice, out: RequestOutput,
                 completion: list[TokenLogprobs] | None) -> dict | None:
        if completion is None:
            return None
        prompt = out.prompt_logprobs or []
        return completion_logprobs([*prompt, *completion],
                                   first_token=self._first_tokens[choice.prompt_index])


async def _tokens(prompt: str | list[int], served: ServedModel) -> list[int]:
    """A text prompt encoded once for its n choices, off the engine's thread (where a long one
    would hold up every stream), and before admission, which counts its tokens."""
    if isinstance(prompt, str):
        return await served.backend.chat_tokenizer.encode_text(prompt)
    return prompt


def _completion(generation: Generation, echo: _Echo | None, finals) -> dict:
    choices = []
    for i, (out, choice) in enumerate(zip(finals, generation.choices, strict=True)):
        completion = out.outputs[0]
        text, logprobs = completion.text, completion_logprobs(completion.logprobs)
        if echo is not None:
            text = echo.text(choice) + text
            logprobs = echo.logprobs(choice, out, completion.logprobs)
        choices.append({"index": i, "text": text, "finish_reason": finish_reason(out),
                        "logprobs": logprobs})
    return {**_header(generation), "choices": choices,
            "usage": usage(finals, generation.choices)}


def _header(generation: Generation) -> dict:
    return {"id": generation.request_id, "object": "text_completion",
            "created": generation.created, "model": generation.served.name}


async def _chunks(generation: Generation, echo: _Echo | None, include_usage: bool,
                  return_progress: bool) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}
    echoed = [echo is None] * len(generation.choices)

    def choice_chunk(index: int, out: RequestOutput, reason: str | None) -> dict:
        completion = out.outputs[0]
        text, delta = completion.delta_text, completion.delta_logprobs
        # Where this chunk's tokens start in the choice's text.
        offset = len(completion.text) - len(text)
        logprobs = completion_logprobs(delta, offset)
        if not echoed[index] and (text or delta or reason):
            choice = generation.choices[index]
            echoed[index] = True
            prompt_text = echo.text(choice)
            text = prompt_text + text
            logprobs = echo.logprobs(choice, out, delta)
        return {**_header(generation), **extra, "choices": [
            {"index": index, "text": text, "finish_reason": reason, "logprobs": logprobs}]}

    def usage_chunk(counts: dict) -> dict:
        return {**_header(generation), "choices": [], "usage": counts}

    async for event in sse_events(generation, choice_chunk,
                                  usage_chunk if include_usage else None, return_progress):
        yield event
