"""The step cost table's first figures, timed at load before any request arrives.

Scratch sequences with a short context step through the runner as decodes verifying drafts:
one sequence with 0 to k drafts (1 to k+1 rows), then two with k drafts each (the rows of a
small batch that speculates; larger ones extrapolate, and are timed once they run). Their KV
lands in blocks no request holds yet, and nothing of it is ever cached or read by a request.
Each shape is timed twice and the faster time kept: whatever else the machine does only ever
adds time. A mixture of experts' table is interpolated and extrapolated by the experts its rows
read (`step_work`), not by its rows.
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial

from pagoda.engine.core.scheduler import ScheduledSequence, SchedulerOutput
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.loading.expert_footprint import is_expert_tensor
from pagoda.engine.models.architecture import DecoderArchitecture
from pagoda.engine.models.config import weight_shapes
from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.spec_decode.step_cost import ExpertStepWork, StepCost

logger = logging.getLogger(__name__)

# A context of a few blocks: long enough to be a real decode, short enough to be quick.
CALIBRATION_CONTEXT = 48
CALIBRATION_REPEATS = 2
CALIBRATION_BATCH = 2


def calibrate_step_cost(runner, num_speculative_tokens: int, max_rows: int) -> StepCost:
    """Time decode steps of 1 to k+1 rows, then of a small batch speculating, on `runner`'s
    free KV blocks. max_rows: the step's token budget, which no shape exceeds."""
    k = num_speculative_tokens
    shapes = [[d] for d in range(k + 1)] + [[k] * CALIBRATION_BATCH]
    steps = [step for step in map(partial(_scratch_step, runner), shapes)
             if step is not None and step.num_batched_tokens <= max_rows]
    began = time.perf_counter()
    cost = StepCost(work=step_work(runner.model.arch))
    if steps:
        runner.execute(steps[-1])  # untimed: the first run of a shape touches memory first
    for step in steps:
        cost.observe(step.num_batched_tokens,
                     min(_timed(runner, step) for _ in range(CALIBRATION_REPEATS)))
    logger.info("step cost by rows, calibrated in %.2f s: %s", time.perf_counter() - began,
                {rows: f"{seconds * 1e3:.1f} ms" for rows, seconds in cost.table().items()})
    return cost


def step_work(arch: DecoderArchitecture) -> ExpertStepWork | None:
    """How a mixture of experts' step grows with its rows; None for a dense model. Its dense
    share is that of the parameters one token reads (a proxy for their bytes): every weight but
    the routed experts', of which top_k of E, and the token table's one row where the
    vocabulary projection is a matrix of its own."""
    moe = arch.moe
    if moe is None:
        return None
    shapes = weight_shapes(arch)
    if "lm_head.weight" in shapes:
        del shapes["model.embed_tokens.weight"]
    routed = sum(math.prod(shape) for name, shape in shapes.items() if is_expert_tensor(name))
    dense = sum(math.prod(shape) for shape in shapes.values()) - routed
    read = dense + routed * moe.top_k / moe.num_experts
    return ExpertStepWork(moe.num_experts, moe.top_k, dense / read)


def _timed(runner, sched: SchedulerOutput) -> float:
    began = time.perf_counter()
    out = runner.execute(sched)  # returns sampled token ids: the device has finished the step
    # Less a multi-token-prediction block's chained passes, which the engine costs apart.
    return time.perf_counter() - began - out.draft_seconds


def _scratch_step(runner, drafts_per_seq: list[int]) -> SchedulerOutput | None:
    """One step of len(drafts_per_seq) decoding sequences, each verifying that many drafts,
    in KV blocks and recurrent state slots numbered from 0 (all free before the first
    request)."""
    block_size = runner.block_size
    blocks_per_seq = -(-(CALIBRATION_CONTEXT + max(drafts_per_seq)) // block_size)
    if blocks_per_seq * len(drafts_per_seq) > min(g.num_blocks for g in runner.kv_cache_groups):
        return None  # a KV pool too small for this batch
    if 0 < runner.num_state_slots < len(drafts_per_seq):
        return None  # as few recurrent state slots
    out = SchedulerOutput()
    for i, num_drafts in enumerate(drafts_per_seq):
        token_ids = [(7 * i + t) % runner.vocab_size for t in range(CALIBRATION_CONTEXT)]
        seq = Sequence(f"calibration-{i}", token_ids, SamplingParams(temperature=0.0),
                       frozenset())
        seq.block_ids = list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))
        seq.windowed_block_ids = [seq.block_ids] * (len(runner.kv_cache_groups) - 1)
        if runner.num_state_slots:  # recurrent layers: slots no request holds yet either
            seq.state_slot = i
        out.scheduled.append(ScheduledSequence(seq, CALIBRATION_CONTEXT - 1, 1 + num_drafts,
                                               token_ids[:num_drafts]))
    return out
