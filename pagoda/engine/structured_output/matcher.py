"""A request's place in its grammar, and the bitmask of a step's constrained rows."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
import xgrammar as xgr

from pagoda.engine.quantization.native_kernels import load_native
from pagoda.kernels.cpu import token_bitmask
from pagoda.kernels.cpu.token_bitmask import TokenBitmask

logger = logging.getLogger(__name__)

_ALL_ALLOWED = -1  # every bit set


class GrammarState:
    """Advances with each token a request keeps; says which tokens may come next."""

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)

    @property
    def is_terminated(self) -> bool:
        """The grammar has ended and taken its stop token: nothing more may follow."""
        return self._matcher.is_terminated()

    def accept(self, token_ids: list[int]) -> None:
        """Advance past tokens sampled under this grammar's masks."""
        for token in token_ids:
            if self._matcher.is_terminated():
                return  # tokens drafted past the stop token, which the scheduler drops
            if not self._matcher.accept_token(token):
                # Only a fully masked row (every logit -inf) can sample a token outside it.
                logger.warning("token %d is outside its request's grammar", token)
                return

    def fill(self, bitmask: torch.Tensor, row: int, drafts: list[int]) -> None:
        """Rows row..row+len(drafts): what may follow the tokens so far, then each draft in
        turn. After a draft the grammar refuses, or a drafted stop token, the rows allow
        everything: a refused draft is rejected at its own row, a stop token ends the reply,
        and the rows after either are never used."""
        self._matcher.fill_next_token_bitmask(bitmask, row)
        accepted = 0
        for j, draft in enumerate(drafts, 1):
            if not self._matcher.accept_token(draft):
                bitmask[row + j:row + len(drafts) + 1] = _ALL_ALLOWED
                break
            accepted += 1
            if self._matcher.is_terminated():  # a drafted stop token: the reply ends there
                bitmask[row + j:row + len(drafts) + 1] = _ALL_ALLOWED
                break
            self._matcher.fill_next_token_bitmask(bitmask, row + j)
        if accepted:
            self._matcher.rollback(accepted)


@dataclass(slots=True)
class GrammarRows:
    """A step's constrained rows: their bits (one per token, set where it is allowed) and which
    logits rows they are."""

    bitmask: torch.Tensor  # int32 [rows, ceil(vocab / 32)]
    rows: torch.Tensor  # int64 [rows], indices into the step's logits

    @classmethod
    def build(cls, entries: list[tuple[int, GrammarState, list[int]]], vocab_size: int,
              device: torch.device) -> GrammarRows:
        """entries: (first logits row, grammar, drafts) per constrained sequence."""
        count = sum(len(drafts) + 1 for _, _, drafts in entries)
        bitmask = xgr.allocate_token_bitmask(count, vocab_size)
        rows = []
        for first, state, drafts in entries:
            state.fill(bitmask, len(rows), drafts)
            rows.extend(range(first, first + len(drafts) + 1))
        return cls(bitmask.to(device), torch.tensor(rows, dtype=torch.long, device=device))

    def apply(self, logits: torch.Tensor) -> None:
        """-inf, in place, on each constrained row's logits of the tokens its grammar forbids."""
        kernel = _native_kernel() if logits.device.type == "cpu" else None
        if kernel is not None and logits.dtype == torch.float32 and logits.stride(-1) == 1:
            kernel.apply(logits, self.bitmask, self.rows)
            return
        xgr.apply_token_bitmask_inplace(logits, self.bitmask, indices=self.rows.tolist())


@functools.cache
def _native_kernel() -> TokenBitmask | None:
    """Our C kernel where it builds; xgrammar's own (a few times slower on a CPU) elsewhere."""
    lib = load_native(token_bitmask.NAME)
    return None if lib is None else TokenBitmask(lib)
