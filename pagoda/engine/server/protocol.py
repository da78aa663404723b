"""The request bodies of the OpenAI API we serve, as strict pydantic models.

Types are strict (a string is not a number); ranges are left to `SamplingParams`, whose errors
name the field. Fields other clients send that do not change the result (user, metadata, store)
are ignored; fields that would and that this server does not honour (tools, echo, an image) are
refused in words rather than silently dropped. docs/SERVER.md lists every field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from pagoda.engine.sampling.fields import FIELD_OF, SAMPLING_FIELDS
from pagoda.engine.sampling.params import (
    SamplingParams,
    StructuredOutputsParams,
    response_format_constraint,
)
from pagoda.engine.requests.constraints import one_constraint
from pagoda.engine.server.errors import APIError, NamedAPIError, rule_errors
from pagoda.engine.server.image_parts import ChatImages
from pagoda.engine.text.bounded_json import MAX_JSON_DEPTH, nesting_depth

MAX_N = 16
# Tools one request may offer, and the length of a function's name (OpenAI's limits).
MAX_TOOLS = 128
MAX_FUNCTION_NAME = 64
# The most choices one request may ask for (its prompts x n): a batch of thousands would hold the
# engine's queue, and memory, for everyone else.
MAX_CHOICES = 128
# Embeddings: the inputs of one request (OpenAI's limit), and their tokens all together.
MAX_EMBEDDING_INPUTS = 2048
MAX_EMBEDDING_TOKENS = 262_144
# OpenAI's `user`: an identifier, not a document.
MAX_USER_CHARS = 256


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ClosedModel(StrictModel):
    """A nested object of OpenAI's whose fields are all known: another field is a 400 naming
    it, as OpenAI's own API answers, never silently dropped."""

    model_config = ConfigDict(strict=True, extra="forbid")


class ImageURL(ClosedModel):
    url: str
    detail: str | None = None


class ContentPart(StrictModel):
    """A part of a message's content: text, or an image where the model takes them (see
    `engine_chat`)."""

    type: str
    text: str | None = None
    image_url: ImageURL | None = None
    # Where the part and its image's URL came from in another API's request (the Responses
    # API's input[0].content[1] and its image_url, a Messages block and its source), for its
    # errors' names; None: this request's own messages.
    source_path: str | None = None
    source_url_path: str | None = None


class FunctionCall(ClosedModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends and returns it


class ToolCallParam(ClosedModel):
    """A call the assistant made, as a client sends it back in the history."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(StrictModel):
    """A message of the chat. Other fields are read in `_engine_message`: null ones (what the
    SDKs send back of an assistant message: refusal, annotations, audio) are nothing to
    honour; any other is a 400 naming it."""

    model_config = ConfigDict(strict=True, extra="allow")

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    # An assistant's reasoning before its answer, under vLLM's name or the newer one: it
    # reaches templates that read it (Qwen3's keeps the last turn's).
    reasoning_content: str | None = None
    reasoning: str | None = None

    def text(self, index: int, images: ChatImages | None = None) -> str:
        """The message's text; its image parts' markers in it where `images` reads them."""
        if isinstance(self.content, list):
            return "".join(_part_text(part, f"messages[{index}].content[{j}]", images)
                           for j, part in enumerate(self.content))
        text = self.content or ""
        return text if images is None else images.text(text, f"messages[{index}].content")


def _part_text(part: ContentPart, path: str, images: ChatImages | None) -> str:
    # Another API's part is named as that request names it, and refused by its type as that
    # API's other refusals are.
    error = APIError if part.source_path is None else NamedAPIError
    path = part.source_path or path
    type_path = f"{path}.type"
    if part.type == "image_url" and images is not None:
        if part.image_url is None:
            raise APIError(400, f"{path}.image_url is missing: an image part needs its URL",
                           param=f"{path}.image_url")
        return images.image(part.image_url.url, part.image_url.detail, path,
                            part.source_url_path or f"{path}.image_url.url", error)
    if part.type != "text" and part.source_path is not None:
        raise error(400, f"{type_path}: an image, and this model takes text only; send the "
                         "message as text", param=type_path)
    if part.type != "text":
        raise APIError(400, f"{path} is an {part.type!r} part: this model takes text only; "
                            "send the message as text", param=path)
    if part.text is None:
        raise APIError(400, f"{path}.text is missing: a text part needs its text",
                       param=f"{path}.text")
    return part.text if images is None else images.text(part.text, path)


# OpenAI's newer name for the system role; every other role is the engine's to check.
_ROLE_NAMES = {"developer": "system"}


def engine_chat(messages: list[ChatMessage],
                images: ChatImages | None = None) -> list[dict[str, object]]:
    """The chat as the engine takes it; roles and contents are validated there. An assistant's
    calls and a tool's result keep what the templates read of them. images: where the model
    takes them, what reads the image parts (else an image part is refused)."""
    if not messages:
        raise APIError(400, "messages is empty: give at least one message", param="messages")
    return [_engine_message(m, i, images) for i, m in enumerate(messages)]


def _engine_message(m: ChatMessage, index: int,
                    images: ChatImages | None) -> dict[str, object]:
    _refuse_other_fields(m, index)
    message: dict[str, object] = {"role": _ROLE_NAMES.get(m.role, m.role),
                                  "content": m.text(index, images)}
    reasoning = _reasoning(m, index)
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if m.name is not None:
        message["name"] = m.name
    if m.tool_calls:
        if m.role != "assistant":
            raise APIError(400, f"messages[{index}].tool_calls is only for assistant messages",
                           param=f"messages[{index}].tool_calls")
        for j, call in enumerate(m.tool_calls):
            _check_depth(call.function.arguments,
                         f"messages[{index}].tool_calls[{j}].function.arguments")
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in m.tool_calls]
    if m.role == "tool" and m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    return message


def _reasoning(m: ChatMessage, index: int) -> str | None:
    given = {name: value for name, value in (("reasoning_content", m.reasoning_content),
                                             ("reasoning", m.reasoning)) if value is not None}
    if not given:
        return None
    path = f"messages[{index}].{next(iter(given))}"
    if m.role != "assistant":
        raise APIError(400, f"{path} is only for assistant messages: a model's reasoning is "
                            "its own", param=path)
    if len(set(given.values())) > 1:
        raise APIError(400, f"messages[{index}] gives reasoning_content and reasoning that "
                            "differ: give one", param=path)
    return next(iter(given.values()))


def _refuse_other_fields(m: ChatMessage, index: int) -> None:
    for name, value in (m.model_extra or {}).items():
        if value not in (None, "", [], {}):
            path = f"messages[{index}].{name}"
            raise APIError(400, f"{path} is not read by this server (a message takes role, "
                                "content, name, tool_calls, tool_call_id and an assistant's "
                                "reasoning_content): leave it out", param=path)


def _check_depth(arguments: str, path: str) -> None:
    """Arguments are read back as JSON for the template: refuse what nests too deep to read."""
    depth = nesting_depth(arguments)
    if depth > MAX_JSON_DEPTH:
        raise APIError(400, f"{path} nests {depth:,} levels deep: at most {MAX_JSON_DEPTH} are "
                            "read; send arguments of ordinary depth", param=path)


def check_choices(num_prompts: int, n: int) -> None:
    """Refuse a request for more than MAX_CHOICES choices before anything is built for them."""
    if num_prompts * n > MAX_CHOICES:
        raise APIError(400, f"this request asks for {num_prompts * n} choices ({num_prompts} "
                            f"prompts x n={n}); this server makes at most {MAX_CHOICES} per "
                            "request: send fewer prompts per request or lower n",
                       param="prompt" if num_prompts > 1 else "n", code="too_many_choices")


def is_set(value: Any) -> bool:
    return value is not None


def is_given(value: Any) -> bool:
    """Anything but null or false (`"logprobs": false` asks for nothing)."""
    return value is not None and value is not False


def asks_for(value: Any) -> bool:
    """Anything but null, false or empty (`"logit_bias": {}`, `"tools": []`)."""
    return is_given(value) and value not in ({}, [], "")


# A field we do not honour: refused when its value would change the result, with why.
Refusal = tuple[Callable[[Any], bool], str]
# llama.cpp's mirostat (1 or 2) replaces the other filters with a feedback loop on surprise;
# its tau and eta tune only that loop, so they are ignored (mirostat is never on here).
_SAMPLER_REFUSED: dict[str, Refusal] = {
    "mirostat": (lambda v: v not in (None, 0), "its sampler has no mirostat: send 0, or "
                 "sample with top_p, min_p or typical_p"),
}
_MIROSTAT_TUNING = frozenset({"mirostat_tau", "mirostat_eta"})
_CHAT_REFUSED: dict[str, Refusal] = {
    "functions": (asks_for, "it takes tools, not the deprecated functions: send them as tools"),
    "function_call": (is_set, "it takes tool_choice, not the deprecated function_call"),
    "modalities": (lambda v: v is not None and v != ["text"], "this model answers in text only"),
    "audio": (is_set, "this model answers in text only"),
    **_SAMPLER_REFUSED,
}
_COMPLETION_REFUSED: dict[str, Refusal] = {
    "suffix": (asks_for, "it does not complete text before a suffix"),
    **_SAMPLER_REFUSED,
}


# Fields clients send that change nothing here: who asks, what to store, how to bill.
_IGNORED = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key",
                      "safety_identifier"})


class RefusingRequest(StrictModel):
    """A request body that keeps the fields it does not declare, to refuse those it cannot
    honour and those it does not know (`check_supported`), as OpenAI's own API does."""

    model_config = ConfigDict(strict=True, extra="allow")
    _refused: ClassVar[dict[str, Refusal]] = {}
    _ignored: ClassVar[frozenset[str]] = _IGNORED

    def check_supported(self) -> None:
        for name, value in (self.model_extra or {}).items():
            refusal = self._refused.get(name)
            if refusal is not None and refusal[0](value):
                raise APIError(400, f"{name} is not supported by this server: {refusal[1]}",
                               param=name)
            if refusal is None and name not in self._ignored:
                raise APIError(400, f"Unrecognized request argument supplied: {name} (this "
                                    "server does not know it, so it would have no effect: "
                                    "leave it out)", param=name)


class StreamOptions(StrictModel):
    include_usage: bool = False


class JSONSchemaFormat(ClosedModel):
    name: str | None = None
    description: str | None = None
    # OpenAI's field is `schema`, which pydantic's BaseModel reserves.
    json_schema: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictModel):
    """OpenAI's response_format: text, any JSON object, or JSON following a schema."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    type: str
    json_schema: JSONSchemaFormat | None = None

    def constraint(self) -> StructuredOutputsParams | None:
        try:
            return response_format_constraint(self.model_dump(by_alias=True))
        except ValueError as exc:
            param = "response_format.type" if "type=" in str(exc) else \
                "response_format.json_schema.schema"
            raise APIError(400, str(exc), param=param) from exc


class StructuredOutputs(StrictModel):
    """vLLM's structured_outputs: one constraint (see pagoda.engine.sampling.params)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    json_: dict | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def constraint(self) -> StructuredOutputsParams:
        return StructuredOutputsParams(json=self.json_, regex=self.regex, choice=self.choice,
                                       grammar=self.grammar, json_object=bool(self.json_object))


# Where a constraint may come from: OpenAI's, vLLM's (current and older names) and llama.cpp's.
_CONSTRAINT_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex",
                      "guided_choice", "guided_grammar", "json_schema", "grammar")
# Where the JSON schema sits in the fields that hold it deeper, for errors naming its keywords.
_SCHEMA_PATHS = {"response_format": "response_format.json_schema.schema",
                 "structured_outputs": "structured_outputs.json"}


def _table_fields() -> dict[str, Any]:
    """Each sampling field of the table, and each other name it goes by, as an optional
    request field of its kind (ranges are SamplingParams' to check)."""
    given: dict[str, Any] = {}
    for sampling_field in SAMPLING_FIELDS:
        for name in (sampling_field.name, *sampling_field.aliases):
            given[name] = (sampling_field.kind | None, None)
    return given


# The table's fields (pagoda.engine.sampling.fields) under their names and aliases.
_SamplingFields = create_model("_SamplingFields", __base__=RefusingRequest, **_table_fields())


class _SamplingRequest(_SamplingFields):
    """The sampling fields both endpoints share, in OpenAI's names plus vLLM's extras; the
    sampling knobs (temperature, top_p, top_k, ...) come from the table."""

    _ignored: ClassVar[frozenset[str]] = _IGNORED | _MIROSTAT_TUNING

    model: str | None = None
    max_tokens: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    # llama.cpp's: while a long prompt is read, stream chunks with its `prompt_progress`.
    return_progress: bool = False
    # OpenAI's: token id (as a string) -> bias in [-100, 100].
    logit_bias: dict[str, float] | None = None
    # vLLM's.
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    # Constraints (at most one; see `constraint`).
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # llama.cpp's.
    json_schema: dict | None = None
    grammar: str | None = None
    # llama.cpp's and Ollama's names for max_tokens, and whether a cached prefix is reused
    # (false computes the whole prompt).
    n_predict: int | None = None
    cache_prompt: bool = True
    # vLLM's: at most this many tokens of reasoning, then the engine ends it and the model
    # answers (pagoda/engine/sampling/reasoning_budget.py).
    thinking_token_budget: int | None = None

    def aliased(self, name: str, *aliases: str):
        """The field's value, given under its own name or under one of llama.cpp's `aliases`
        (a 400 where two are given)."""
        value = getattr(self, name)
        for alias in aliases:
            other = getattr(self, alias)
            if value is not None and other is not None:
                raise APIError(400, f"{name} and {alias} are the same setting: give one",
                               param=alias)
            value = other if value is None else value
        return value

    def _max_tokens(self, default: int | None) -> int | None:
        """max_tokens, or llama.cpp's n_predict (-1: until the context ends, as there), or
        `default` where neither is given."""
        given = self.aliased("max_tokens", "n_predict")
        if given is None:
            return default
        if self.n_predict is not None and self.n_predict < 0:
            if self.n_predict != -1:
                raise APIError(400, f"n_predict={self.n_predict}: -1 (no limit) or a count",
                               param="n_predict")
            return None
        return given

    def constraint(self) -> tuple[str, StructuredOutputsParams] | None:
        """The one constraint the request gives, with where it sits: the field that gave it,
        or the schema inside it (`response_format.json_schema.schema`), for errors to name."""
        given = [name for name in self._constraint_fields() if _constrains(getattr(self, name))]
        with rule_errors():
            name = one_constraint(given)
        if name is None:
            return None
        try:
            constraint = _constraint_of(name, getattr(self, name))
        except ValueError as exc:
            raise APIError(400, f"{name}: {exc}", param=name) from exc
        if constraint is None:
            return None
        return _SCHEMA_PATHS.get(name, name) if constraint.kind == "json" else name, constraint

    def _constraint_fields(self) -> tuple[str, ...]:
        return _CONSTRAINT_FIELDS[1:]

    def _logit_bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        bias = {}
        for key, value in self.logit_bias.items():
            if not key.isdigit():
                raise APIError(400, f"logit_bias has the key {key!r}: keys are token ids "
                                    "(strings of digits)", param="logit_bias")
            bias[int(key)] = value
        return bias

    def _logprobs(self) -> int | None:
        return None

    def _prompt_logprobs(self) -> int | None:
        return None

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, max_tokens: int | None, index: int = 0) -> SamplingParams:
        """The engine's parameters for choice `index` (a seed moves on by one per choice, so n
        seeded choices differ and stay reproducible)."""
        given = {name: self.aliased(name, *FIELD_OF[name].aliases) for name in FIELD_OF}
        options = {name: value for name, value in given.items() if value is not None}
        seed = self.seed if self.seed is None or index == 0 else (self.seed + index) % (1 << 64)
        constraint = self.constraint()
        return SamplingParams(**options, max_tokens=max_tokens, stop=self.stop, seed=seed,
                              ignore_eos=self.ignore_eos,
                              structured_outputs=None if constraint is None else constraint[1],
                              logit_bias=self._logit_bias(),
                              allowed_token_ids=self.allowed_token_ids,
                              bad_words=self.bad_words or None, logprobs=self._logprobs(),
                              prompt_logprobs=self._prompt_logprobs(),
                              skip_special_tokens=self.skip_special_tokens,
                              skip_reading_prefix_cache=not self.cache_prompt,
                              thinking_token_budget=self.thinking_token_budget)


def _constrains(value: Any) -> bool:
    if isinstance(value, ResponseFormat):
        return value.type != "text"
    return value is not None


def _constraint_of(name: str, value: Any) -> StructuredOutputsParams | None:
    if isinstance(value, (ResponseFormat, StructuredOutputs)):
        return value.constraint()
    if name in ("guided_json", "json_schema"):
        return StructuredOutputsParams(json=value)
    if name == "guided_regex":
        return StructuredOutputsParams(regex=value)
    if name == "guided_choice":
        return StructuredOutputsParams(choice=value)
    return StructuredOutputsParams(grammar=value)


class FunctionDefinition(ClosedModel):
    # An empty name is refused with the other tool rules (pagoda/engine/requests/tools.py).
    name: str = Field(max_length=MAX_FUNCTION_NAME)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(ClosedModel):
    type: str
    function: FunctionDefinition


class NamedFunction(ClosedModel):
    name: str


class NamedToolChoice(ClosedModel):
    type: str
    function: NamedFunction


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # vLLM's: more variables for the chat template (Qwen3's enable_thinking).
    chat_template_kwargs: dict | None = None
    # OpenAI's; honoured where the model's template reads it (gpt-oss's), else refused
    # (pagoda/engine/server/chat.py).
    reasoning_effort: str | None = None
    # vLLM's: go on with the last (assistant) message instead of starting a new reply.
    continue_final_message: bool = False
    add_generation_prompt: bool = True

    _refused: ClassVar[dict[str, Refusal]] = _CHAT_REFUSED

    def _constraint_fields(self) -> tuple[str, ...]:
        return _CONSTRAINT_FIELDS

    def _logprobs(self) -> int | None:
        """OpenAI's rule: top_logprobs (0-20) needs logprobs=true."""
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        if not self.logprobs:
            return None
        return 0 if self.top_logprobs is None else self.top_logprobs

    def resolved_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self._max_tokens(default=None)


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = None
    # The legacy API's: how many best tokens beside each sampled one (0-5).
    logprobs: int | None = Field(default=None, ge=0, le=5)
    # The prompt said again before each completion (scored too, with logprobs).
    echo: bool = False
    response_format: ResponseFormat | None = None

    _refused: ClassVar[dict[str, Refusal]] = _COMPLETION_REFUSED

    def _constraint_fields(self) -> tuple[str, ...]:
        return _CONSTRAINT_FIELDS

    def _logprobs(self) -> int | None:
        return self.logprobs

    def _prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None

    def check_supported(self) -> None:
        super().check_supported()
        if self.best_of is not None and self.best_of != self.n:
            raise APIError(400, "best_of is not supported by this server: it returns every "
                                "choice it makes (best_of must equal n)", param="best_of")

    def resolved_max_tokens(self) -> int | None:
        return self._max_tokens(default=16)  # OpenAI's default here

    def prompts(self) -> list[str | list[int]]:
        """One prompt, or a batch of them, as text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        return list(prompt)


class EmbeddingRequest(RefusingRequest):
    """OpenAI's embeddings body. `dimensions` is honoured only at the model's own width (the
    route refuses any other: this model was not trained for shortened vectors). `user` is
    OpenAI's opaque identifier of the end user, for abuse tracking: a string of at most
    MAX_USER_CHARS, logged with the request id (pagoda.engine.server.embeddings); it changes no
    vector. Every other field is refused, the chat routes' ignored ones too: none of them is
    OpenAI's here."""

    _ignored: ClassVar[frozenset[str]] = frozenset()

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = Field(default=None, max_length=MAX_USER_CHARS)

    def inputs(self) -> list[str | list[int]]:
        """One input, or a batch of them, as text or token ids."""
        if self._is_single():
            return [self.input if isinstance(self.input, str) else list(self.input)]
        return list(self.input)

    def input_field(self, index: int) -> str:
        """How errors name input `index`: `input` when it is the only one."""
        return "input" if self._is_single() else f"input[{index}]"

    def _is_single(self) -> bool:
        given = self.input
        return isinstance(given, str) or (bool(given) and all(isinstance(x, int) for x in given))


class TokenizeRequest(StrictModel):
    """vLLM's POST /tokenize: a text prompt, or a chat in the model's template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    # As a chat request gives them, so the count is the reply's prompt's.
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    chat_template_kwargs: dict | None = None


class DetokenizeRequest(StrictModel):
    """vLLM's POST /detokenize: token ids back to text."""

    model: str | None = None
    tokens: list[int]
