"""POST /v1/chat/completions: OpenAI's chat completion, whole or streamed as SSE chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request

from engine.outputs import CompletionOutput
from engine.server.admission import WorkBudget
from engine.server.errors import APIError, as_api_errors
from engine.server.generation import (
    Choice,
    Generation,
    finish_reason,
    new_id,
    respond,
    sse,
    sse_events,
    usage,
)
from engine.server.logprobs import chat_logprobs
from engine.server.metrics import ServerMetrics
from engine.server.protocol import ChatCompletionRequest, engine_chat
from engine.server.served import ServedModel


async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 served: ServedModel, metrics: ServerMetrics,
                                 budget: WorkBudget):
    body.check_supported()
    messages = engine_chat(body.messages)
    if body.continue_final_message and body.add_generation_prompt:
        raise APIError(400, "continue_final_message needs add_generation_prompt=false",
                       param="add_generation_prompt")
    with as_api_errors("messages"):
        # Encoded once for all n choices, and before admission, which counts its tokens. With
        # continue_final_message the prompt ends inside the last reply, to go on with it.
        prompt = await served.backend.chat_tokenizer.encode_chat(
            messages, continue_final_message=body.continue_final_message)
        choices = [Choice(prompt, body.sampling_params(body.resolved_max_tokens(), i))
                   for i in range(body.n)]
    generation = Generation(served, metrics, budget, choices, new_id("chatcmpl"), "messages")
    constraint = body.constraint()
    if constraint is not None:
        await generation.check_constraint(constraint[0])
    return await respond(generation, request, body.stream,
                         lambda: _chunks(generation, body.include_usage, body.return_progress),
                         lambda finals: _completion(generation, finals))


def _completion(generation: Generation, finals) -> dict:
    return {
        "id": generation.request_id, "object": "chat.completion", "created": generation.created,
        "model": generation.served.name,
        "choices": [{"index": i, "message": {"role": "assistant", "content": out.outputs[0].text},
                     "finish_reason": finish_reason(out),
                     "logprobs": chat_logprobs(out.outputs[0].logprobs)}
                    for i, out in enumerate(finals)],
        "usage": usage(finals, generation.choices),
    }


async def _chunks(generation: Generation, include_usage: bool,
                  return_progress: bool) -> AsyncIterator[str]:
    def chunk(choices: list[dict], **extra) -> dict:
        body = {"id": generation.request_id, "object": "chat.completion.chunk",
                "created": generation.created, "model": generation.served.name,
                "choices": choices}
        return {**body, "usage": None, **extra} if include_usage else body

    def choice_chunk(index: int, completion: CompletionOutput, reason: str | None) -> dict:
        delta = completion.delta_text
        return chunk([{"index": index, "delta": {"content": delta} if delta else {},
                       "finish_reason": reason,
                       "logprobs": chat_logprobs(completion.delta_logprobs)}])

    for index in range(len(generation.choices)):
        yield sse(chunk([{"index": index, "delta": {"role": "assistant", "content": ""},
                          "finish_reason": None, "logprobs": None}]))
    usage_chunk = (lambda counts: chunk([], usage=counts)) if include_usage else None
    async for event in sse_events(generation, choice_chunk, usage_chunk, return_progress):
        yield event
