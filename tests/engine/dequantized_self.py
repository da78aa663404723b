"""A quantized model against its dequantized self (the same file loaded with quantization
"none"): for the tests of each CPU kernel's engine path."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.loading.loader import load_model
from pagoda.engine.loading.on_load import apply_quantization
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner

PROMPT_IDS = list(range(3, 200))


def logits_error(path: Path, token_ids: list[int] = PROMPT_IDS) -> tuple[float, ModelRunner]:
    """The mean relative distance of the prompt's logits from the dequantized model's, and the
    quantized model's runner."""
    quantized = load_model(path)
    dequantized = dataclasses.replace(quantized,
                                      weights=apply_quantization(quantized.weights, "none"))
    runner = ModelRunner(quantized, EngineConfig(num_kv_blocks=32))
    got = prompt_logits(runner, token_ids)
    want = prompt_logits(ModelRunner(dequantized, EngineConfig(num_kv_blocks=32)), token_ids)
    return ((got - want).norm(dim=-1) / want.norm(dim=-1)).mean().item(), runner


def greedy_tokens(path: Path, quantization: str) -> list[list[int]]:
    """12 greedy tokens after each of two prompts, chunked prefill and batched decode."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [list(range(100, 143)), list(range(200, 205))]
    llm = LLM(str(path), num_kv_blocks=16, num_threads=1, quantization=quantization,
              max_num_batched_tokens=24)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
