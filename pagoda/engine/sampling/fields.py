"""The sampling fields, defined once: each knob of how a reply's tokens are picked, with what
every place that reads, writes, shows or sends it needs to know.

Derived from SAMPLING_FIELDS, never written out again: SamplingParams' fields and their checks,
the server's request fields (pagoda.engine.server.protocol), the command line's flags
(pagoda.engine.cli.common), and in the app the stored settings and their import checks, the
defaults for new chats, the settings panel's rows and the requests to other servers. Adding a
field is a row here and its work in the sampler (pagoda.engine.worker.sampler). No torch: the
app's store reads this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

Number = int | float


@dataclass(slots=True, frozen=True)
class Bounds:
    """The values a field takes: from `low` to `high` (None: no end), each end open or closed."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: Number) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def words(self) -> str:
        """`in (0, 1]`, `>= 0`, `> 0`: the range as an error message says it."""
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{self.low:g}, "
                    f"{self.high:g}{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return "any number"


@dataclass(slots=True, frozen=True)
class Spin:
    """How the app's settings panel edits a field: a spin box from `low` to `high` by `step`,
    with `decimals` (0: a whole-number box), showing `off_text` at its minimum where that value
    turns the field off. Narrower than Bounds where the full range is no use in a chat."""

    low: float
    high: float
    step: float
    decimals: int = 0
    off_text: str = ""


@dataclass(slots=True, frozen=True)
class SamplingField:
    """One sampling knob. `name` is vLLM's and OpenAI's (SamplingParams', the request's, the
    store's); `default` is the engine's (SamplingParams, the server, the command line) and
    `chat_default` a new chat's in the app where it differs; `neutral` is the value that turns
    it off (None: it has none), which requests to other servers leave out."""

    name: str
    kind: type[int] | type[float]
    default: Number
    neutral: Number | None
    bounds: Bounds
    label: str  # the settings panel's row
    help: str  # the panel's tooltip and the command line's help
    spin: Spin
    chat_default: Number | None = None
    # In OpenAI's API, so every OpenAI-compatible server reads it under this name.
    openai: bool = False
    # Sent to other servers even at its neutral value, so a server's own default (vLLM's is
    # the model's generation config) never replaces the chat's.
    always_sent: bool = False
    # The names the servers beyond OpenAI's read it under, by kind of server ("vllm",
    # "sglang", "llama.cpp"); Pagoda's reads every field under its own name.
    servers: Mapping[str, str] = field(default_factory=dict)
    # Other names this server takes for it (llama.cpp's and Ollama's); both given is a 400.
    aliases: tuple[str, ...] = ()

    @property
    def chat_value(self) -> Number:
        """A new chat's value in the app."""
        return self.default if self.chat_default is None else self.chat_default

    @property
    def flag(self) -> str:
        """The command line's option: --top-p for top_p."""
        return "--" + self.name.replace("_", "-")

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this field, as the end of a sentence naming it
        ("must be in (0, 1]"), or None where it is fine."""
        if self.kind is int and not _is_int(value):
            return "must be an integer"
        if self.kind is float and not (_is_number(value) and math.isfinite(value)):
            return "must be a finite number"
        if not self.bounds.holds(value):
            off = "" if self.neutral is None else f" ({self.neutral:g} turns it off)"
            return f"must be {self.bounds.words()}{off}"
        return None


_OTHER_SERVERS = ("vllm", "sglang", "llama.cpp")


def _everywhere(name: str, llama_cpp: str | None = None) -> dict[str, str]:
    """vLLM, SGLang and llama.cpp all reading the field as `name` (llama.cpp as `llama_cpp`
    where given)."""
    names = dict.fromkeys(_OTHER_SERVERS, name)
    if llama_cpp is not None:
        names["llama.cpp"] = llama_cpp
    return names


SAMPLING_FIELDS: tuple[SamplingField, ...] = (
    SamplingField(
        "temperature", float, default=1.0, neutral=None, chat_default=0.7,
        bounds=Bounds(low=0.0), label="Temperature",
        help="Randomness: 0 always picks the likeliest token, higher values vary more.",
        spin=Spin(0.0, 2.0, 0.05, 2), openai=True, always_sent=True),
    SamplingField(
        "top_k", int, default=0, neutral=0, bounds=Bounds(low=-1), label="Top K",
        help="Sample only from this many likeliest tokens; 0 (or -1) turns the limit off.",
        spin=Spin(0, 1_000_000, 1, off_text="Off"), servers=_everywhere("top_k")),
    SamplingField(
        "top_p", float, default=1.0, neutral=1.0, chat_default=0.9,
        bounds=Bounds(low=0.0, high=1.0, low_open=True), label="Top P",
        help="Sample only from the likeliest tokens whose probabilities add up to this share.",
        spin=Spin(0.01, 1.0, 0.05, 2), openai=True, always_sent=True),
    SamplingField(
        "min_p", float, default=0.0, neutral=0.0, bounds=Bounds(low=0.0, high=1.0),
        label="Min P",
        help="Drop tokens less likely than this fraction of the likeliest token; 0 turns it "
             "off.",
        spin=Spin(0.0, 1.0, 0.01, 2), servers=_everywhere("min_p")),
    SamplingField(
        "repetition_penalty", float, default=1.0, neutral=1.0, chat_default=1.1,
        bounds=Bounds(low=0.0, low_open=True), label="Repetition penalty",
        help="Makes tokens that already appeared (in the prompt or the reply) less likely; "
             "1.0 turns it off.",
        spin=Spin(1.0, 2.0, 0.05, 2),
        servers=_everywhere("repetition_penalty", llama_cpp="repeat_penalty"),
        # llama.cpp's name; here it weighs the prompt and the whole reply, as vLLM's does,
        # where llama.cpp's looks at the last 64 tokens.
        aliases=("repeat_penalty",)),
    SamplingField(
        "presence_penalty", float, default=0.0, neutral=0.0,
        bounds=Bounds(low=-2.0, high=2.0), label="Presence penalty",
        help="Lowers every token the reply already holds by this much, once; 0 turns it off.",
        spin=Spin(-2.0, 2.0, 0.1, 2), openai=True),
    SamplingField(
        "frequency_penalty", float, default=0.0, neutral=0.0,
        bounds=Bounds(low=-2.0, high=2.0), label="Frequency penalty",
        help="Lowers every token the reply already holds by this much per time it appears; "
             "0 turns it off.",
        spin=Spin(-2.0, 2.0, 0.1, 2), openai=True),
    SamplingField(
        "typical_p", float, default=1.0, neutral=1.0,
        bounds=Bounds(low=0.0, high=1.0, low_open=True), label="Typical P",
        help="Locally typical sampling: only the tokens whose surprise is nearest the "
             "expected surprise, as many as add up to this share; 1.0 turns it off.",
        spin=Spin(0.01, 1.0, 0.05, 2), servers={"llama.cpp": "typical_p"}),
    SamplingField(
        "min_tokens", int, default=0, neutral=0, bounds=Bounds(low=0), label="Min tokens",
        help="The reply may not end (its end token, a stop token or a stop string) before "
             "this many tokens; 0 turns it off.",
        spin=Spin(0, 32768, 16, off_text="Off"),
        servers={"vllm": "min_tokens", "sglang": "min_tokens"}),
)

FIELD_OF: dict[str, SamplingField] = {f.name: f for f in SAMPLING_FIELDS}

T = TypeVar("T")


def with_sampling_fields(*, chat: bool = False):
    """A class decorator, put under @dataclass: one field per row of SAMPLING_FIELDS ahead of
    the class's own, as if written out (`temperature: float = 1.0`), at the engine's defaults
    or, with `chat`, at a new chat's. So SamplingParams and the app's settings gain a row's
    field without being edited."""

    def add_fields(cls: type[T]) -> type[T]:
        own = dict(cls.__dict__.get("__annotations__", {}))
        cls.__annotations__ = {**{f.name: f.kind.__name__ for f in SAMPLING_FIELDS}, **own}
        for f in SAMPLING_FIELDS:
            setattr(cls, f.name, f.chat_value if chat else f.default)
        return cls

    return add_fields


def sampling_values(source: object) -> dict[str, Number]:
    """The value of each sampling field in `source` (SamplingParams, the app's settings or
    options: anything that has them), by name."""
    return {f.name: getattr(source, f.name) for f in SAMPLING_FIELDS}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
