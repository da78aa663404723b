"""Turns a request's growing token ids into streamed text, in vLLM's incremental style.

Each step decodes only a short window of tokens: the ones already shown last step (the prefix, for
context such as a word's leading space) plus the new ones. The difference between the two decodes is
the new text. Text is held back while it ends in a partial UTF-8 character or could still turn into a
stop string, so every delta the caller shows is final.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Prompt tokens decoded as context ahead of the first output token, so it gets the same leading
# space (or lack of one) it would have in the full text.
_PROMPT_CONTEXT_TOKENS = 5
# What a decoder yields for bytes that do not (yet) form a whole UTF-8 character.
_REPLACEMENT_CHAR = "\ufffd"


@dataclass(slots=True)
class DetokenizerUpdate:
    """The result of one step: text that is safe to show now, and the stop string hit, if any."""

    delta_text: str
    stop_string: str | None = None


class IncrementalDetokenizer:
    """Streams one request's output text; the concatenated deltas always equal `text`.

    `tokenizer` is a Hugging Face fast tokenizer. The output excludes the first stop string and
    everything after it. Once a stop string is hit the request is over: later updates are ignored.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], stop: list[str],
                 skip_special_tokens: bool = True,
                 always_skip: frozenset[int] = frozenset(), min_tokens: int = 0) -> None:
        """always_skip: ids that are never text, special tokens shown or not (the stop
        tokens that end a reply). min_tokens: a stop string ends the output only from the
        update that brings it to this many tokens on (SamplingParams.min_tokens); one written
        before is text."""
        self._tokenizer = tokenizer
        # all_special_ids is recomputed on every access; look it up once per request.
        special = frozenset(tokenizer.all_special_ids) if skip_special_tokens else frozenset()
        self._skip_ids = special | always_skip
        self._stop = list(stop)
        self._tokens_until_stops = min_tokens
        # The decode window: tokens[:read_offset] were already turned into text, the rest are new.
        self._tokens = self._to_tokens(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._read_offset = len(self._tokens)
        self._pending = ""
        self._chunks: list[str] = []
        self._stop_string: str | None = None

    @property
    def text(self) -> str:
        """The output text shown so far (all deltas joined), stop string cut."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the output, once one has."""
        return self._stop_string

    def update(self, new_token_ids: list[int], finished: bool = False) -> DetokenizerUpdate:
        """Adds sampled tokens; `finished` (stop, length or abort) releases all held-back text."""
        if self._stop_string is not None:
            return DetokenizerUpdate("")
        self._tokens_until_stops -= len(new_token_ids)
        self._tokens.extend(self._to_tokens(new_token_ids))
        self._pending += self._decode_new_text(flush=finished)
        return self._release(finished)

    def _to_tokens(self, token_ids: list[int]) -> list[str]:
        kept = [t for t in token_ids if t not in self._skip_ids]
        return self._tokenizer.convert_ids_to_tokens(kept)

    def _decode_new_text(self, flush: bool) -> str:
        prefix_text = self._tokenizer.convert_tokens_to_string(self._tokens[:self._read_offset])
        window_text = self._tokenizer.convert_tokens_to_string(self._tokens)
        incomplete = len(window_text) <= len(prefix_text) or window_text.endswith(_REPLACEMENT_CHAR)
        if incomplete and not flush:
            return ""
        # The new tokens become the next step's prefix; older ones are never decoded again, which
        # keeps each step's cost independent of the output's length.
        del self._tokens[:self._read_offset]
        self._read_offset = len(self._tokens)
        new_text = window_text[len(prefix_text):]
        # A request ending (max_tokens, abort) between the bytes of one character ends at the last
        # whole character: the bytes that never completed are not text.
        return new_text.rstrip(_REPLACEMENT_CHAR) if flush else new_text

    def _release(self, finished: bool) -> DetokenizerUpdate:
        hit = self._find_stop()
        if hit is not None:
            index, stop = hit
            return self._emit(self._pending[:index], held="", stop=stop)
        if finished:
            return self._emit(self._pending, held="")
        cut = len(self._pending) - self._stop_prefix_len()
        return self._emit(self._pending[:cut], held=self._pending[cut:])

    def _find_stop(self) -> tuple[int, str] | None:
        if self._tokens_until_stops > 0:
            return None
        # Pending text held no whole stop string last step, so searching it all finds only new hits.
        hits = [(index, stop) for stop in self._stop if (index := self._pending.find(stop)) != -1]
        return min(hits, key=lambda hit: hit[0], default=None)

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of the pending text that more text could make a stop string."""
        longest = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:n]):
                    longest = n
                    break
        return longest

    def _emit(self, delta: str, held: str, stop: str | None = None) -> DetokenizerUpdate:
        self._pending = held
        self._stop_string = stop
        if delta:
            self._chunks.append(delta)
        return DetokenizerUpdate(delta, stop)
