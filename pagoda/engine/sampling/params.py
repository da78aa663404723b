"""Per-request parameters, validated on construction: SamplingParams for a reply, PoolingParams
for a prompt read into one vector (an embedding)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from pagoda.engine.sampling.fields import SAMPLING_FIELDS, with_sampling_fields
from pagoda.engine.text.unicode import lone_surrogate_at

_GREEDY_EPS = 1e-5
# torch.Generator.manual_seed takes a 64-bit unsigned seed.
_SEED_LIMIT = 1 << 64
# The most top logprobs a row may ask for (OpenAI's chat caps top_logprobs at 20).
MAX_LOGPROBS = 20
# Bounds on what a request may hand the grammar compiler and the sampler: a constraint's text
# (a JSON schema, a regex, a grammar, all choices together), how many choices, biased tokens,
# allowed tokens and banned words.
MAX_CONSTRAINT_CHARS = 65536
MAX_CHOICES = 1024
MAX_TOKEN_LIST = 65536
MAX_BAD_WORDS = 1024
# OpenAI's range for a logit bias.
_BIAS_LIMIT = 100.0


_CONSTRAINT_KINDS = ("json", "regex", "grammar", "choice", "structural_tag")


@dataclass(slots=True, frozen=True)
class StructuredOutputsParams:
    """One constraint on a reply, in vLLM's names: exactly one of a JSON schema (`json`, as a
    dict or its text), any JSON object (`json_object=True`), a regular expression, an EBNF
    grammar (xgrammar's dialect, as GBNF), a choice among strings, or a structural tag
    (xgrammar's, as JSON text: how a harmony reply's frame holds another constraint, see
    pagoda/engine/parsers/harmony_frame.py)."""

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    choice: tuple[str, ...] | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None and not isinstance(self.choice, tuple):
            _check(isinstance(self.choice, list), "structured_outputs.choice", self.choice,
                   "must be a list of strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [name for name in _CONSTRAINT_KINDS if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object is True else []
        _check(len(given) == 1, "structured_outputs", given or None,
               "must give exactly one of json, json_object, regex, grammar, choice or "
               "structural_tag")
        self._validate()

    def _validate(self) -> None:
        _check(isinstance(self.json_object, bool), "structured_outputs.json_object",
               self.json_object, "must be True or False")
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            _check(value is None or (isinstance(value, str) and value.strip() != ""),
                   f"structured_outputs.{name}", value, "must be a non-empty string")
        if self.json is not None:
            _check(isinstance(self.json, (dict, str)), "structured_outputs.json", self.json,
                   "must be a JSON schema: an object, or its text")
        if self.choice is not None:
            _check(0 < len(self.choice) <= MAX_CHOICES
                   and all(isinstance(c, str) and c for c in self.choice),
                   "structured_outputs.choice", _preview(self.choice),
                   f"must be 1 to {MAX_CHOICES} non-empty strings")
        size = len(self.text())
        _check(size <= MAX_CONSTRAINT_CHARS, f"structured_outputs.{self.kind}",
               f"<{size} characters>", f"must be at most {MAX_CONSTRAINT_CHARS} characters")

    @property
    def kind(self) -> str:
        """Which constraint this is: json, json_object, regex, grammar, choice or
        structural_tag."""
        if self.json_object is True:
            return "json_object"
        return next(name for name in _CONSTRAINT_KINDS if getattr(self, name) is not None)

    def text(self) -> str:
        """The constraint as text: the schema's JSON, the regex, the grammar, or the choices
        as a JSON list. With `kind`, what a compiled grammar is cached under."""
        if self.json is not None:
            if isinstance(self.json, str):
                return self.json
            try:
                return json.dumps(self.json, ensure_ascii=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"SamplingParams.structured_outputs.json is not JSON: {exc}"
                                 ) from exc
        if self.choice is not None:
            return json.dumps(list(self.choice), ensure_ascii=False)
        return self.regex or self.grammar or self.structural_tag or ""


def response_format_constraint(response_format: Mapping) -> StructuredOutputsParams | None:
    """OpenAI's response_format as a constraint: None for {"type": "text"}, any JSON object for
    "json_object", the schema of "json_schema" (`json_schema.schema`). ValueError naming what
    is wrong."""
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if schema is None:
            raise ValueError("response_format.json_schema.schema is missing: a json_schema "
                             "response format needs its schema")
        return StructuredOutputsParams(json=schema)
    raise ValueError(f"response_format.type={kind!r} is not supported: use 'text', "
                     "'json_object' or 'json_schema'")


@dataclass(slots=True)
@with_sampling_fields()
class SamplingParams:
    """How to pick each next token and when to stop, in vLLM's vocabulary.

    The sampling knobs come first, one field per row of pagoda.engine.sampling.fields
    (temperature, top_k, top_p, the penalties, ...), each with its default and its neutral
    value there; temperature 0 means greedy.
    """

    seed: int | None = None
    max_tokens: int | None = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # A constraint on the reply (structured output); see StructuredOutputsParams.
    structured_outputs: StructuredOutputsParams | None = None
    # OpenAI's logit_bias: token id -> a bias added to its logit, in [-100, 100] (-100 bans).
    logit_bias: dict[int, float] | None = None
    # vLLM's: only these tokens may be sampled.
    allowed_token_ids: list[int] | None = None
    # vLLM's: words never written (their tokens, with and without a leading space, banned where
    # the output so far would complete one).
    bad_words: list[str] | None = None
    # The log-probability of each sampled token and of this many best tokens at its position
    # (0 gives the sampled token's alone); None returns none.
    logprobs: int | None = None
    # The same for every prompt token after the first (the prompt is then computed in full:
    # the prefix cache cannot give logprobs for what it skips).
    prompt_logprobs: int | None = None
    # vLLM's: False writes special tokens into the text (a tool parser's tags, such as
    # Mistral's [TOOL_CALLS]); the stop tokens that end a reply are never text.
    skip_special_tokens: bool = True
    # vLLM's: compute the whole prompt, not reusing a cached prefix (llama.cpp's
    # cache_prompt=false); the prompt's blocks are still cached for later requests.
    skip_reading_prefix_cache: bool = False
    # vLLM's: at most this many tokens of reasoning, after which the engine closes the
    # reasoning itself and the model answers (pagoda/engine/sampling/reasoning_budget.py); a
    # model whose template has no reasoning writes none, so there is nothing to cut.
    thinking_token_budget: int | None = None

    def __post_init__(self) -> None:
        # None means none, as in vLLM's and OpenAI's APIs.
        self.stop = [] if self.stop is None else self.stop
        self.stop_token_ids = [] if self.stop_token_ids is None else self.stop_token_ids
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check(isinstance(self.stop, (list, tuple)), "stop", self.stop,
               "must be a string, a list of strings or None")
        _check(isinstance(self.stop_token_ids, (list, tuple)), "stop_token_ids",
               self.stop_token_ids, "must be a list of token ids or None")
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self._validate()
        self._validate_logits_controls()

    def _validate(self) -> None:
        for sampling_field in SAMPLING_FIELDS:
            value = getattr(self, sampling_field.name)
            problem = sampling_field.problem(value)
            _check(problem is None, sampling_field.name, value, problem or "")
        _check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
               "max_tokens", self.max_tokens, "must be a positive integer or None")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               self.min_tokens, f"must be at most max_tokens ({self.max_tokens})")
        _check(self.seed is None or (_is_int(self.seed) and 0 <= self.seed < _SEED_LIMIT),
               "seed", self.seed, "must be None or an integer from 0 to 2**64 - 1")
        _check(all(isinstance(s, str) and s and lone_surrogate_at(s) is None for s in self.stop), "stop",
               self.stop, "must be non-empty strings of valid Unicode (no lone surrogates)")
        _check(all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               self.stop_token_ids, "must be non-negative integers")
        for name in ("ignore_eos", "skip_special_tokens", "skip_reading_prefix_cache"):
            _check(isinstance(getattr(self, name), bool), name, getattr(self, name),
                   "must be True or False")

    def _validate_logits_controls(self) -> None:
        _check(self.structured_outputs is None
               or isinstance(self.structured_outputs, StructuredOutputsParams),
               "structured_outputs", self.structured_outputs,
               "must be a StructuredOutputsParams or None")
        _check(not (self.structured_outputs is not None and self.ignore_eos), "ignore_eos",
               self.ignore_eos, "cannot be combined with structured_outputs: the constraint "
               "decides where the reply ends")
        _check(self.thinking_token_budget is None
               or (_is_int(self.thinking_token_budget) and self.thinking_token_budget >= 0),
               "thinking_token_budget", self.thinking_token_budget,
               "must be None or a non-negative integer")
        _check(self.thinking_token_budget is None or self.structured_outputs is None,
               "thinking_token_budget", self.thinking_token_budget,
               "cannot be combined with structured_outputs: the constraint shapes the whole "
               "reply, so the budget could not write the end of its reasoning")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or (_is_int(value) and 0 <= value <= MAX_LOGPROBS), name, value,
                   f"must be None or an integer from 0 to {MAX_LOGPROBS}")
        self._validate_token_lists()
        if self.bad_words is not None:
            _check(isinstance(self.bad_words, (list, tuple)) and len(self.bad_words) <= MAX_BAD_WORDS
                   and all(isinstance(w, str) and w.strip() for w in self.bad_words),
                   "bad_words", _preview(self.bad_words),
                   f"must be a list of at most {MAX_BAD_WORDS} non-empty strings")
            self.bad_words = list(self.bad_words)

    def _validate_token_lists(self) -> None:
        if self.logit_bias is not None:
            _check(isinstance(self.logit_bias, dict) and len(self.logit_bias) <= MAX_TOKEN_LIST,
                   "logit_bias", _preview(self.logit_bias),
                   f"must map at most {MAX_TOKEN_LIST} token ids to biases")
            for token, bias in self.logit_bias.items():
                _check(_is_int(token) and token >= 0, "logit_bias", token,
                       "must have non-negative integer token ids as keys")
                _check(_is_number(bias) and -_BIAS_LIMIT <= bias <= _BIAS_LIMIT, "logit_bias",
                       {token: bias}, "must have biases from -100 to 100")
        if self.allowed_token_ids is not None:
            _check(isinstance(self.allowed_token_ids, (list, tuple))
                   and 0 < len(self.allowed_token_ids) <= MAX_TOKEN_LIST
                   and all(_is_int(t) and t >= 0 for t in self.allowed_token_ids),
                   "allowed_token_ids", _preview(self.allowed_token_ids),
                   f"must be a list of 1 to {MAX_TOKEN_LIST} non-negative token ids")
            self.allowed_token_ids = list(self.allowed_token_ids)

    @property
    def processes_logits(self) -> bool:
        """Whether any token is biased, allowed or banned before sampling."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None or bool(self.bad_words)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def uses_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _preview(value: object) -> object:
    """A value short enough to quote in an error message."""
    text = repr(value)
    return value if len(text) <= 80 else f"{text[:77]}..."


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name}={value!r} is invalid: {rule}")


@dataclass(slots=True, frozen=True)
class PoolingParams:
    """A pooling request (vLLM's name) is prefilled and never decoded. Its vector is the model's
    final hidden state (after the final RMSNorm, before lm_head) averaged over every token of
    the prompt, then L2-normalised unless `normalize` is False.

    Mean pooling, not the last token's state: a chat model was not trained to sum a text up in
    its last position (that state is shaped to predict one next token), while the mean over
    every position weighs the whole text, which is what retrieval compares. Models trained for
    last-token embeddings would want another pooling; none is served here yet.

    Every token is computed: a pooling request never reads blocks from the prefix cache (it
    would skip those tokens' hidden states) and leaves none in it."""

    normalize: bool = True
