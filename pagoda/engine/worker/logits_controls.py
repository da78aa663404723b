"""A request's say over which tokens may come next: OpenAI's logit_bias and vLLM's
allowed_token_ids and bad_words, applied to the rows that ask before penalties and sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_NEG_INF = float("-inf")


@dataclass(slots=True, frozen=True)
class RowControls:
    """What one logits row's request asks, with its output so far (drafts before it counted)."""

    row: int
    logit_bias: dict[int, float] | None
    allowed_token_ids: list[int] | None
    bad_words_token_ids: list[list[int]] | None
    output_token_ids: list[int]


@dataclass(slots=True)
class LogitsControls:
    bias_positions: torch.Tensor | None  # flat row * vocab + token
    bias_values: torch.Tensor | None
    allowed: list[tuple[int, torch.Tensor]]  # (row, its allowed token ids)
    banned_positions: torch.Tensor | None  # flat row * vocab + token

    @classmethod
    def build(cls, rows: list[RowControls], vocab_size: int,
              device: torch.device) -> LogitsControls:
        bias_positions, bias_values, banned = [], [], []
        allowed = []
        for r in rows:
            base = r.row * vocab_size
            for token, bias in (r.logit_bias or {}).items():
                if token < vocab_size:
                    bias_positions.append(base + token)
                    bias_values.append(float(bias))
            if r.allowed_token_ids is not None:
                ids = [t for t in r.allowed_token_ids if t < vocab_size]
                allowed.append((r.row, torch.tensor(ids, dtype=torch.long, device=device)))
            banned.extend(base + t for t in _completing_tokens(r.bad_words_token_ids or [],
                                                               r.output_token_ids)
                          if t < vocab_size)
        return cls(_long(bias_positions, device) if bias_positions else None,
                   torch.tensor(bias_values, device=device) if bias_values else None,
                   allowed, _long(banned, device) if banned else None)

    def apply(self, logits: torch.Tensor) -> None:
        """In place: biases added, tokens outside a row's allowed list and the last token of a
        bad word its output would complete set to -inf."""
        flat = logits.view(-1)
        if self.bias_positions is not None:
            flat.index_add_(0, self.bias_positions, self.bias_values)
        for row, ids in self.allowed:
            kept = logits[row, ids].clone()
            logits[row].fill_(_NEG_INF)
            logits[row, ids] = kept
        if self.banned_positions is not None:
            flat[self.banned_positions] = _NEG_INF


def _completing_tokens(words: list[list[int]], output: list[int]) -> list[int]:
    """The token that would finish each bad word after this output: a one-token word always,
    a longer one when the output ends with all of it but its last token."""
    found = []
    for word in words:
        head = word[:-1]
        if not head or (len(output) >= len(head) and output[-len(head):] == head):
            found.append(word[-1])
    return found


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def bad_words_token_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word's tokens as it would be written first in a text and after a space (a
    tokenizer spells the two differently), without duplicates."""
    found: list[list[int]] = []
    for word in words:
        bare = word.lstrip()
        for text in (bare, " " + bare):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in found:
                found.append(ids)
    return found
