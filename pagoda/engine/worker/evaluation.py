"""Teacher-forced quality of one set of weights against another on the same text.

Quantized weights are judged against the same model dequantized ("none"): over a fixed text,
how often both predict the same next token (top-1 agreement) and how the perplexities compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagoda.engine.core.image_spans import ImageSpan, chunk_end
from pagoda.engine.core.kv_cache_manager import KVCacheManager
from pagoda.engine.core.scheduler import ScheduledSequence
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.worker.model_runner import ModelRunner


@dataclass(slots=True, frozen=True)
class QualityReport:
    num_tokens: int
    top1_agreement: float
    reference_perplexity: float
    perplexity: float

    @property
    def perplexity_ratio(self) -> float:
        return self.perplexity / self.reference_perplexity


@torch.inference_mode()
def prompt_logits(runner: ModelRunner, token_ids: list[int], chunk: int = 256,
                  images: tuple[ImageSpan, ...] = ()) -> torch.Tensor:
    """Logits after every token of token_ids [len, vocab] (float32), prefilled in chunks into
    the runner's KV cache, which must hold the whole text; nothing else may run meanwhile.
    images: the prompt's images at their placeholders (a chunk never ends inside one)."""
    num_blocks = -(-len(token_ids) // runner.block_size)
    if num_blocks > runner.num_blocks:
        raise ValueError(f"{len(token_ids)} tokens need {num_blocks} KV blocks; the runner has "
                         f"{runner.num_blocks}")
    seq = Sequence("evaluation", list(token_ids), SamplingParams(max_tokens=1), frozenset(),
                   images=images)
    if runner.num_state_slots:
        seq.state_slot = 0  # the recurrent layers' states: nothing else runs meanwhile
    # The engine's bookkeeping, so that windowed layers' blocks are released as in a chat.
    kv = KVCacheManager(runner.kv_cache_groups, runner.block_size, enable_prefix_caching=False)
    logits = []
    start = 0
    while start < len(token_ids):
        n = chunk_end(images, start, min(chunk, len(token_ids) - start))
        seq.num_computed_tokens = start
        if not kv.allocate_slots(seq, n):
            raise ValueError(f"a chunk of {n} tokens finds no room in the runner's windowed "
                             "KV cache groups: evaluate in smaller chunks")
        inputs = runner.prepare_inputs([ScheduledSequence(seq, start, n)])
        every_row = torch.arange(n, device=runner.device)
        logits.append(runner.model.forward(inputs.input_ids, inputs.positions, inputs.attn,
                                           runner.kv_caches, every_row,
                                           runner.recurrent_step(inputs),
                                           runner.image_embeddings(inputs)).float().cpu())
        start += n
    return torch.cat(logits)


def compare(reference_logits: torch.Tensor, logits: torch.Tensor,
            token_ids: list[int]) -> QualityReport:
    """Agreement of next-token predictions, and perplexity of the text under each."""
    targets = torch.tensor(token_ids[1:])
    reference, candidate = reference_logits[:-1], logits[:-1]
    agreement = (reference.argmax(-1) == candidate.argmax(-1)).float().mean().item()
    return QualityReport(len(targets), agreement,
                         math.exp(F.cross_entropy(reference, targets).item()),
                         math.exp(F.cross_entropy(candidate, targets).item()))
