"""POST /v1/responses (OpenAI's Responses API): the request becomes a chat request, which the
chat endpoint's code checks, encodes and runs (engine/server/chat.py); its reply comes back as
output items, whole or as typed SSE events (engine/server/responses_stream.py), and is kept for
previous_response_id (engine/server/responses_store.py)."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.requests import Request

from engine.outputs import RequestOutput
from engine.parsers.replies import ReplyShape
from engine.server.admission import WorkBudget
from engine.server.chat import PreparedChat, prepare_chat
from engine.server.errors import APIError, validation_error
from engine.server.generation import finish_reason, respond, usage
from engine.server.metrics import ServerMetrics
from engine.server.protocol import ChatCompletionRequest, ChatMessage, FunctionCall, ToolCallParam
from engine.server.responses_protocol import (
    ContentPart,
    InputItem,
    NamedFunctionChoice,
    ResponsesRequest,
)
from engine.server.responses_store import ResponseStore, StoredResponse
from engine.server.responses_stream import ResponseEvents, item_id, sse_event
from engine.server.served import ServedModel

# The fields each type of input item may have (beside `type`, `id` and `status`).
_ITEM_FIELDS = {
    "message": {"role", "content", "phase"},
    "function_call": {"call_id", "name", "arguments"},
    "function_call_output": {"call_id", "output"},
    "reasoning": {"summary", "content", "encrypted_content"},
}
_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")
# The chat request's field names in its errors, as this endpoint names them.
_FIELD_NAMES = (
    (re.compile(r"\bmessages(\[\d+\])?(\.[\w\[\]\.]+)?"), "input"),
    (re.compile(r"\bresponse_format\.json_schema\.schema"), "text.format.schema"),
    (re.compile(r"\bresponse_format(\.\w+)?"), "text.format"),
    (re.compile(r"\btools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"\btool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"\breasoning_effort\b"), "reasoning.effort"),
    (re.compile(r"\bmax_(completion_)?tokens\b"), "max_output_tokens"),
)


@dataclass(slots=True, frozen=True)
class Turn:
    """What one request adds to the conversation, and the history it continues."""

    history: tuple[ChatMessage, ...]
    added: tuple[ChatMessage, ...]


async def create_response(body: ResponsesRequest, request: Request, served: ServedModel,
                          metrics: ServerMetrics, budget: WorkBudget, store: ResponseStore):
    body.check_supported()
    turn = _turn(body, store)
    response_id = item_id("resp")
    with responses_errors():
        chat = _chat_request(body, [*_instructions(body), *turn.history, *turn.added])
        prepared = await prepare_chat(chat, request, served, metrics, budget, response_id)
    finished = _Finisher(body, turn, prepared, served.name, store)
    with responses_errors():
        return await respond(prepared.generation, request, body.stream,
                             lambda: _events(prepared.shape, finished),
                             lambda finals: finished.whole(finals[0]))


def _turn(body: ResponsesRequest, store: ResponseStore) -> Turn:
    if body.previous_response_id is None:
        if body.input is None:
            raise APIError(400, "input is missing: give the input, or a previous_response_id "
                                "to continue", param="input")
        return Turn((), tuple(input_messages(body.input, ())))
    history = store.get(body.previous_response_id, "previous_response_id").conversation
    return Turn(history, () if body.input is None else tuple(input_messages(body.input, history)))


def _instructions(body: ResponsesRequest) -> list[ChatMessage]:
    """The instructions, first; a previous response's are not carried on (OpenAI's rule)."""
    return [] if body.instructions is None else [ChatMessage(role="system",
                                                             content=body.instructions)]


def input_messages(given: str | list[dict], history: tuple[ChatMessage, ...],
                   ) -> list[ChatMessage]:
    """`input` as chat messages: a function call joins the assistant message before it (a
    model's calls and its text are one turn), its output is a tool message."""
    if isinstance(given, str):
        return [ChatMessage(role="user", content=given)]
    messages: list[ChatMessage] = []
    # call_id -> the function, which some templates name in its output's message; the call
    # may be in this input or in the response it continues.
    names = {call.id: call.function.name for message in history
             for call in message.tool_calls or ()}
    for index, raw in enumerate(given):
        item = _input_item(raw, index)
        if item.type == "message":
            messages.append(_message(item, index))
        elif item.type == "function_call":
            names[item.call_id] = item.name
            _add_call(messages, item)
        elif item.type == "function_call_output":
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id,
                                        name=names.get(item.call_id),
                                        content=_text(item.output, f"input[{index}].output")))
    return messages


def _input_item(raw: dict, index: int) -> InputItem:
    """One item of `input`, checked by its type; an error names the item and its field."""
    kind = raw.get("type", "message")
    allowed = _ITEM_FIELDS.get(kind) if isinstance(kind, str) else None
    if allowed is None:
        raise APIError(400, f"input[{index}].type={kind!r} is not supported by this "
                            "server: it reads message, function_call, function_call_output "
                            "and reasoning items", param=f"input[{index}].type")
    foreign = sorted(raw.keys() - allowed - {"type", "id", "status"})
    if foreign:
        raise APIError(400, f"input[{index}].{foreign[0]}: a {kind} item has no such field "
                            "here", param=f"input[{index}].{foreign[0]}")
    try:
        item = InputItem.model_validate(raw)
    except ValidationError as exc:
        raise _within(validation_error(exc), f"input[{index}]") from exc
    needed = {"message": ("role",), "function_call": ("call_id", "name", "arguments"),
              "function_call_output": ("call_id", "output")}.get(item.type, ())
    for name in needed:
        if getattr(item, name) is None:
            raise APIError(400, f"input[{index}].{name} is missing: a {item.type} item needs "
                                f"{', '.join(needed)}", param=f"input[{index}].{name}")
    return item


def _within(error: APIError, path: str) -> APIError:
    """An error about a part of `path`, named from the request's top."""
    if error.param is None:
        return APIError(error.status, f"{path}: {error.message}", param=path)
    return APIError(error.status, error.message.replace(error.param, f"{path}.{error.param}", 1),
                    param=f"{path}.{error.param}")


def _message(item: InputItem, index: int) -> ChatMessage:
    if item.role not in _MESSAGE_ROLES:
        raise APIError(400, f"input[{index}].role={item.role!r}: a message's role is one of "
                            f"{', '.join(_MESSAGE_ROLES)}", param=f"input[{index}].role")
    return ChatMessage(role=item.role, content=_text(item.content, f"input[{index}].content"))


def _text(content: str | list | None, path: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(_part_text(part, f"{path}[{j}]") for j, part in enumerate(content))


def _part_text(part: ContentPart, path: str) -> str:
    if part.type not in _TEXT_PARTS:
        raise APIError(400, f"{path} is an {part.type!r} part: this model takes text only "
                            "(input_text, output_text)", param=f"{path}.type")
    if part.text is None:
        raise APIError(400, f"{path}.text is missing: a text part needs its text",
                       param=f"{path}.text")
    unknown = sorted(part.model_extra or {})
    if unknown:
        raise APIError(400, f"Unrecognized request argument supplied: {path}.{unknown[0]} (a "
                            "text part has no such field)", param=f"{path}.{unknown[0]}")
    return part.text


def _add_call(messages: list[ChatMessage], item: InputItem) -> None:
    call = ToolCallParam(id=item.call_id, function=FunctionCall(name=item.name,
                                                                arguments=item.arguments))
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def _chat_request(body: ResponsesRequest, messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request that asks for the same reply."""
    fields = {
        "model": body.model, "messages": messages, "stream": body.stream,
        "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature,
        "top_p": body.top_p, "parallel_tool_calls": body.parallel_tool_calls,
        "tools": _chat_tools(body.tools), "tool_choice": _chat_tool_choice(body.tool_choice),
        "response_format": _response_format(body),
        "reasoning_effort": None if body.reasoning is None else body.reasoning.effort,
    }
    try:
        return ChatCompletionRequest.model_validate(
            {name: value for name, value in fields.items() if value is not None})
    except ValidationError as exc:
        raise validation_error(exc) from exc


def _chat_tools(tools: list[dict] | None) -> list[dict] | None:
    if tools is None:
        return None
    chat_tools = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(400, f"tools[{i}].type={tool.get('type')!r}: only 'function' tools "
                                "are supported (the client runs them; this server runs no "
                                "built-in tools)", param=f"tools[{i}].type")
        chat_tools.append({"type": "function",
                           "function": {k: v for k, v in tool.items() if k != "type"}})
    return chat_tools


def _chat_tool_choice(choice: str | NamedFunctionChoice | None) -> str | dict | None:
    if not isinstance(choice, NamedFunctionChoice):
        return choice
    if choice.type != "function" or choice.name is None:
        raise APIError(400, f"tool_choice.type={choice.type!r}: only 'auto', 'none', "
                            "'required' or {'type': 'function', 'name': ...} are supported",
                       param="tool_choice")
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(body: ResponsesRequest) -> dict | None:
    form = None if body.text is None else body.text.format
    if form is None:
        return None
    if form.type != "json_schema":
        return {"type": form.type}
    schema = {"name": form.name, "description": form.description, "schema": form.json_schema,
              "strict": form.strict}
    return {"type": "json_schema",
            "json_schema": {k: v for k, v in schema.items() if v is not None}}


@contextmanager
def responses_errors() -> Iterator[None]:
    """The chat request's errors with this endpoint's field names (input, text.format, ...)."""
    try:
        yield
    except APIError as exc:
        exc.message = _renamed(exc.message)
        exc.param = None if exc.param is None else _renamed(exc.param)
        raise


def _renamed(text: str) -> str:
    for pattern, name in _FIELD_NAMES:
        text = pattern.sub(name, text)
    return text


class _Finisher:
    """A response's object once its reply is read, kept in the store when asked (store)."""

    def __init__(self, body: ResponsesRequest, turn: Turn, prepared: PreparedChat,
                 model: str, store: ResponseStore) -> None:
        self.body = body
        self.turn = turn
        self.prepared = prepared
        self.model = model
        self.store = store

    @property
    def id(self) -> str:
        return self.prepared.generation.request_id

    def snapshot(self, status: str, output: list[dict], final: RequestOutput | None) -> dict:
        """The response object: in progress (no output yet), or done."""
        generation = self.prepared.generation
        reason = None if final is None else finish_reason(final)
        body = {
            "id": self.id, "object": "response", "created_at": generation.created,
            "status": status, "model": self.model, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
            "usage": None if final is None else _usage(final, generation),
            **self.body.echo(),
        }
        if status == "completed":
            body["completed_at"] = int(time.time())
        return body

    def whole(self, final: RequestOutput) -> dict:
        events = ResponseEvents()
        reply = self.prepared.shape.streamer()
        events.feed(reply.feed(final.outputs[0].text))
        events.feed(reply.finish())
        status = status_of(final)
        events.finish(_item_status(status))
        return self.done(status, events.items, final)

    def done(self, status: str, output: list[dict], final: RequestOutput) -> dict:
        body = self.snapshot(status, output, final)
        if self.body.store:
            conversation = (*self.turn.history, *self.turn.added, *_output_messages(output))
            self.store.put(StoredResponse(body, conversation))
        return body


# The event that ends a stream, by the response's status: a reply the server stopped (it is
# shutting down) has no event of its own in OpenAI's set, so it ends as a failure would.
_LAST_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
               "cancelled": "response.failed"}


def status_of(final: RequestOutput) -> str:
    return {"stop": "completed", "length": "incomplete"}.get(finish_reason(final), "cancelled")


def _item_status(status: str) -> str:
    return "completed" if status == "completed" else "incomplete"


def _usage(final: RequestOutput, generation) -> dict:
    counts = usage([final], generation.choices)
    cached = counts["prompt_tokens_details"]["cached_tokens"]
    # What the prompt computed goes into the prefix cache: the tokens it did not find there.
    written = counts["prompt_tokens"] - cached
    return {"input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"]}


def _output_messages(output: list[dict]) -> list[ChatMessage]:
    """The reply as the next turn's history: its text and calls (its reasoning is left out,
    as a chat client's history leaves it)."""
    text = "".join(part["text"] for item in output if item["type"] == "message"
                   for part in item["content"])
    calls = [ToolCallParam(id=item["call_id"], function=FunctionCall(
        name=item["name"], arguments=item["arguments"])) for item in output
        if item["type"] == "function_call"]
    return [ChatMessage(role="assistant", content=text or None, tool_calls=calls or None)]


async def _events(shape: ReplyShape, finished: _Finisher) -> AsyncIterator[str]:
    """The typed events of a streamed response: created, in progress, each item's, and
    completed (or incomplete); an engine failure is an error event."""
    events = ResponseEvents()
    reply = shape.streamer()
    progress = finished.snapshot("in_progress", [], None)
    yield sse_event(events.event("response.created", response=progress))
    yield sse_event(events.event("response.in_progress", response=progress))
    final = None
    try:
        async for _, out in finished.prepared.generation.events():
            sent = events.feed(reply.feed(out.outputs[0].delta_text))
            if out.finished:
                final = out
                sent += events.feed(reply.finish())
            for event in sent:
                yield sse_event(event)
        status = status_of(final)
    except APIError as exc:
        error = exc.body()["error"]
        yield sse_event(events.event("error", code=error["code"], message=error["message"],
                                     param=error["param"]))
        return
    for event in events.finish(_item_status(status)):
        yield sse_event(event)
    body = finished.done(status, events.items, final)
    yield sse_event(events.event(_LAST_EVENT[status], response=body))
