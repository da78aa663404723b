"""Per-request sampling parameters, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.text.unicode import lone_surrogate_at

_GREEDY_EPS = 1e-5
# torch.Generator.manual_seed takes a 64-bit unsigned seed.
_SEED_LIMIT = 1 << 64
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty")


@dataclass(slots=True)
class SamplingParams:
    """How to pick each next token and when to stop, in vLLM's vocabulary.

    temperature 0 means greedy. top_k -1 (or 0) disables top-k; top_p 1 and min_p 0 disable theirs.
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

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

    def _validate(self) -> None:
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            _check(_is_number(value) and math.isfinite(value), name, value,
                   "must be a finite number")
        _check(self.temperature >= 0.0, "temperature", self.temperature, "must be >= 0")
        _check(_is_int(self.top_k) and self.top_k >= -1, "top_k", self.top_k,
               "must be -1 (disabled) or a positive integer")
        _check(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "must be in (0, 1]")
        _check(0.0 <= self.min_p <= 1.0, "min_p", self.min_p, "must be in [0, 1]")
        _check(self.repetition_penalty > 0.0, "repetition_penalty", self.repetition_penalty,
               "must be > 0 (1 disables it)")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", self.presence_penalty,
               "must be in [-2, 2]")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
               self.frequency_penalty, "must be in [-2, 2]")
        _check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
               "max_tokens", self.max_tokens, "must be a positive integer or None")
        _check(self.seed is None or (_is_int(self.seed) and 0 <= self.seed < _SEED_LIMIT),
               "seed", self.seed, "must be None or an integer from 0 to 2**64 - 1")
        _check(all(isinstance(s, str) and s and lone_surrogate_at(s) is None for s in self.stop), "stop",
               self.stop, "must be non-empty strings of valid Unicode (no lone surrogates)")
        _check(all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               self.stop_token_ids, "must be non-negative integers")
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos,
               "must be True or False")

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


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name}={value!r} is invalid: {rule}")
