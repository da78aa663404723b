"""Shared fixtures: the default model is loaded once per test session."""

import os

import torch

# Triton decides whether to interpret when it is first imported, and transformers or torch may
# import it while other test modules are collected: without a GPU, say so before anything runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from engine.loader import LoadedModel, load_model


@pytest.fixture(scope="session")
def default_model() -> LoadedModel:
    """The default SmolLM2-135M-Instruct (config, tokenizer, fp32 weights), loaded once.

    Dequantized ("none"): the parity tests compare it with transformers' own dequantization."""
    return load_model(quantization="none")


@pytest.fixture(scope="session")
def make_engine(default_model):
    """Build an LLMEngine over the already-loaded default model: make_engine(num_kv_blocks=64)."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    def build(**config) -> LLMEngine:
        config.setdefault("num_kv_blocks", 256)
        return LLMEngine(config=EngineConfig(**config), loaded=default_model)

    return build


@pytest.fixture(scope="session")
def make_llm(make_engine):
    """An `LLM` over the shared default model: make_llm(max_num_batched_tokens=32)."""
    from engine.llm import LLM

    return lambda **config: LLM.from_engine(make_engine(**config))
