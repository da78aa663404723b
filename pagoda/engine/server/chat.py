"""POST /v1/chat/completions: OpenAI's chat completion, whole or streamed as SSE chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from starlette.requests import Request

from pagoda.engine.multimodal.images import DecodedImage
from pagoda.engine.outputs import RequestOutput
from pagoda.engine.parsers.replies import ReplyShape, joined_deltas, reply_shape
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.requests.constraints import check_one_constraint
from pagoda.engine.requests.tools import forced_on_new_task, tool_use, tools_constraint
from pagoda.engine.server.admission import WorkBudget
from pagoda.engine.server.errors import APIError, as_api_errors, rule_errors
from pagoda.engine.server.generation import (
    Choice,
    Generation,
    finish_reason,
    new_id,
    respond,
    sse,
    sse_events,
    usage,
)
from pagoda.engine.server.image_parts import ChatImages
from pagoda.engine.server.logprobs import chat_logprobs
from pagoda.engine.server.metrics import ServerMetrics
from pagoda.engine.server.protocol import ChatCompletionRequest, NamedToolChoice, engine_chat
from pagoda.engine.server.served import ServedModel

# Enough of the prompt's end to see whether it opens the reasoning ("<think>\n").
_PROMPT_TAIL_TOKENS = 8
# What gpt-oss's template takes as its reasoning_effort ("Reasoning: high" in its system
# message); OpenAI's other values ("minimal", "none") it has no words for.
REASONING_EFFORTS = ("low", "medium", "high")


@dataclass(slots=True)
class PreparedChat:
    """A chat request ready to run: its generation (encoded, constraint compiled, not yet
    started) and how its replies are read."""

    generation: Generation
    shape: ReplyShape


async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 served: ServedModel, metrics: ServerMetrics,
                                 budget: WorkBudget):
    chat = await prepare_chat(body, request, served, metrics, budget, new_id("chatcmpl"))
    generation, shape = chat.generation, chat.shape
    return await respond(generation, request, body.stream,
                         lambda: _chunks(generation, shape, body.include_usage,
                                         body.return_progress),
                         lambda finals: _completion(generation, shape, finals))


@dataclass(slots=True)
class EncodedChat:
    """A chat request checked and its prompt encoded by the model's template: what the reply
    and a token count (POST /v1/messages/count_tokens) both start from."""

    prompt: list[int]
    use: ToolUse
    constraint: str | None  # the field whose constraint the reply follows, if any
    images: tuple[DecodedImage, ...] = ()  # the chat's, in the order of their placeholders


async def encode_chat_request(body: ChatCompletionRequest, served: ServedModel) -> EncodedChat:
    """The request checked and its prompt encoded, tools and template settings included."""
    body.check_supported()
    images = ChatImages.reader(served.backend.image_prompt, served.remote_images)
    messages = engine_chat(body.messages, images)
    if body.continue_final_message and body.add_generation_prompt:
        raise APIError(400, "continue_final_message needs add_generation_prompt=false",
                       param="add_generation_prompt")
    with rule_errors():
        use = _tool_use(body)
        if served.force_tool_call and body.constraint() is None:
            # A reply held to the request's own format is not forced into a call as well.
            use = forced_on_new_task(use, messages)
        constraint = _constraint(body, use)
    if constraint is not None and body.thinking_token_budget is not None:
        raise APIError(400, f"thinking_token_budget cannot be combined with {constraint}: the "
                            "constraint shapes the whole reply, leaving the budget no place to "
                            "end its reasoning", param="thinking_token_budget")
    template_kwargs = _template_kwargs(body, served.backend.chat_template)
    if images is not None:
        await images.read()  # once the request's cheap checks have passed
    with as_api_errors("messages"):
        # Encoded once for all n choices, and before admission, which counts its tokens. With
        # continue_final_message the prompt ends inside the last reply, to go on with it.
        prompt = await served.backend.chat_tokenizer.encode_chat(
            messages, continue_final_message=body.continue_final_message, tools=use.tools,
            template_kwargs=template_kwargs, expand=None if images is None else images.expand())
    return EncodedChat(prompt, use, constraint, tuple(images.images) if images else ())


async def prepare_chat(body: ChatCompletionRequest, request: Request, served: ServedModel,
                       metrics: ServerMetrics, budget: WorkBudget,
                       request_id: str) -> PreparedChat:
    """The request checked, its prompt encoded and its constraint compiled (the Responses and
    Messages endpoints, pagoda/engine/server/responses.py and messages.py, come here with the chat
    they build)."""
    encoded = await encode_chat_request(body, served)
    prompt, use = encoded.prompt, encoded.use
    try:
        shape = reply_shape(served.backend.chat_template, use,
                            lambda: served.backend.token_text(prompt[-_PROMPT_TAIL_TOKENS:]))
    except ValueError as exc:
        raise APIError(400, str(exc), param="tools") from exc
    with as_api_errors("messages"):
        choices = [Choice(prompt, shape.adjusted(_params(body, i, use)), images=encoded.images)
                   for i in range(body.n)]
    generation = Generation(served, metrics, budget, choices, request_id, "messages")
    generation.end_when(shape.repeat_guard)  # a list of calls that starts over ends
    if encoded.constraint is not None:
        await generation.check_constraint(encoded.constraint, request)
    return PreparedChat(generation, shape)


def _tool_use(body: ChatCompletionRequest) -> ToolUse:
    """The request's tools and tool_choice, checked (pagoda/engine/requests/tools.py)."""
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []]
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        choice = choice.model_dump()
    return tool_use(tools, choice, body.parallel_tool_calls)


def _constraint(body: ChatCompletionRequest, use: ToolUse) -> str | None:
    """The field whose constraint the reply follows, if any: one of the request's, or the
    tools' under tool_choice "required" or a named function (never both)."""
    given = body.constraint()
    check_one_constraint(use, None if given is None else given[0].split(".")[0])
    tools = tools_constraint(use)
    if tools is not None:
        return tools[0]
    return None if given is None else given[0]


def _template_kwargs(body: ChatCompletionRequest, chat_template: str | None) -> dict | None:
    """chat_template_kwargs, with reasoning_effort where the model's template reads it; a 400
    saying why where it does not."""
    effort = body.reasoning_effort
    if effort is None:
        return body.chat_template_kwargs
    if "reasoning_effort" not in (chat_template or ""):
        raise APIError(400, "reasoning_effort is not supported by this model: its chat template "
                            "has no reasoning settings (a reasoning model's thinking comes back "
                            "as reasoning_content; chat_template_kwargs such as enable_thinking "
                            "reach its template)", param="reasoning_effort")
    if effort not in REASONING_EFFORTS:
        raise APIError(400, f"reasoning_effort={effort!r}: this model's chat template takes "
                            "'low', 'medium' or 'high'", param="reasoning_effort")
    kwargs = dict(body.chat_template_kwargs or {})
    if kwargs.get("reasoning_effort", effort) != effort:
        raise APIError(400, "reasoning_effort and chat_template_kwargs.reasoning_effort differ: "
                            "give one", param="reasoning_effort")
    return {**kwargs, "reasoning_effort": effort}


def _params(body: ChatCompletionRequest, index: int, use: ToolUse):
    params = body.sampling_params(body.resolved_max_tokens(), index)
    if use.constraint is None:
        return params
    return replace(params, structured_outputs=use.constraint)


def _completion(generation: Generation, shape: ReplyShape, finals) -> dict:
    choices = []
    for i, out in enumerate(finals):
        message = shape.message(out.outputs[0].text)
        reason = finish_reason(out)
        if message.get("tool_calls") and reason == "stop":
            reason = "tool_calls"
        choices.append({"index": i, "message": message, "finish_reason": reason,
                        "logprobs": chat_logprobs(out.outputs[0].logprobs)})
    return {
        "id": generation.request_id, "object": "chat.completion", "created": generation.created,
        "model": generation.served.name, "choices": choices,
        "usage": usage(finals, generation.choices),
    }


async def _chunks(generation: Generation, shape: ReplyShape, include_usage: bool,
                  return_progress: bool) -> AsyncIterator[str]:
    streams = [shape.streamer() for _ in generation.choices]

    def chunk(choices: list[dict], **extra) -> dict:
        body = {"id": generation.request_id, "object": "chat.completion.chunk",
                "created": generation.created, "model": generation.served.name,
                "choices": choices}
        return {**body, "usage": None, **extra} if include_usage else body

    def choice_chunk(index: int, out: RequestOutput, reason: str | None) -> dict | None:
        completion, stream = out.outputs[0], streams[index]
        delta = stream.feed(completion.delta_text)
        if reason is not None:
            delta = joined_deltas(delta, stream.finish())
            if stream.called and reason == "stop":
                reason = "tool_calls"
        elif completion.delta_text and not delta and not completion.delta_logprobs:
            return None  # text held back (a tag not yet whole): nothing to send yet
        return chunk([{"index": index, "delta": delta, "finish_reason": reason,
                       "logprobs": chat_logprobs(completion.delta_logprobs)}])

    for index in range(len(generation.choices)):
        yield sse(chunk([{"index": index, "delta": {"role": "assistant", "content": ""},
                          "finish_reason": None, "logprobs": None}]))
    usage_chunk = (lambda counts: chunk([], usage=counts)) if include_usage else None
    async for event in sse_events(generation, choice_chunk, usage_chunk, return_progress):
        yield event
