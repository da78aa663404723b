"""Fixtures shared by the engine tests."""

from pathlib import Path

import pytest
import torch

from pagoda.engine.config import EngineConfig
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.hf_reference import load_hf_model

QUALITY_TEXT = Path(__file__).parent / "data" / "quality_text.txt"


@pytest.fixture
def kernels_at_every_step(monkeypatch):
    """The load-time calibration finds the weight-only kernels (q4_gemv where it loads) faster
    than a dequantized GEMM at every step size, so every step of a test runs them: a timing on
    a shared machine, or a bf16 GEMM on a CPU with AVX512-BF16, decides nothing a test of the
    kernels can rely on (the choice itself is tested on timings)."""
    from pagoda.engine.quantization import cpu_paths
    from pagoda.engine.quantization.cpu_paths import RowTimings

    monkeypatch.setattr(cpu_paths, "_timings", lambda probe, native, rows: {
        m: RowTimings(2.0, None if native is None else 1.0, 100.0, 100.0) for m in rows})


# The quality text's English (tokens 0-1,376) and the start of its Chinese: a multiple of
# prompt_logits' 256-token chunk.
QUALITY_HEAD_TOKENS = 1536


def fp32_quality_logits(default_model, num_tokens: int | None = None
                        ) -> tuple[list[int], torch.Tensor]:
    """The quality text's first num_tokens token ids (all by default) and the default model's
    logits after each, every weight dequantized and computed in fp32."""
    token_ids = default_model.tokenizer.encode(QUALITY_TEXT.read_text(encoding="utf-8"))
    assert len(token_ids) >= 2000
    token_ids = token_ids[:num_tokens]
    fp32 = EngineConfig(num_kv_blocks=200, dtype=torch.float32)
    return token_ids, prompt_logits(ModelRunner(default_model, fp32), token_ids)


@pytest.fixture(scope="session")
def quality_reference(default_model) -> tuple[list[int], torch.Tensor]:
    """The quality text's token ids (~2,500, English and Chinese) and the default model's
    fp32 logits after each: the teacher-forced reference for quantized weights and for a
    narrower compute dtype. Computed once per session (a prefill of the whole text), kept until
    its end (the logits take ~0.5 GB)."""
    return fp32_quality_logits(default_model)


@pytest.fixture(scope="session")
def quality_reference_head(default_model) -> tuple[list[int], torch.Tensor]:
    """quality_reference over the text's first QUALITY_HEAD_TOKENS tokens, for the claims whose
    runs cost tens of seconds over the whole text on a 2-core CPU (a bf16 prefill without
    AVX512-BF16, the quantized default model's): ~1,000 of its 1,535 predictions have a top-2
    gap over 0.5, so a path that moved logits by more than rounding would still part from fp32
    at many of them. Measured here, each claim's top-1 agreement over it was at least its
    agreement over the whole text."""
    return fp32_quality_logits(default_model, QUALITY_HEAD_TOKENS)


@pytest.fixture(scope="session")
def default_model_greedy_replies(default_model, make_llm):
    """The parity prompts' greedy replies (tests/engine/models/test_parity.py, MAX_NEW_TOKENS
    each, in one batch, on one thread) from the default model in fp32, with each token's top-2
    logprobs, and the engine's stop tokens: held to transformers by test_parity and to bf16 by
    test_compute_dtype, decoded once for both."""
    from pagoda.engine import SamplingParams
    from tests.engine.models.test_parity import MAX_NEW_TOKENS, NUM_THREADS, parity_prompts

    llm = make_llm(num_kv_blocks=128, num_threads=NUM_THREADS)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS, logprobs=2)
    outputs = llm.generate(parity_prompts(default_model.tokenizer), params)
    return outputs, llm.engine.eos_token_ids


@pytest.fixture(scope="session")
def hf_default_model(default_model):
    """The default model as transformers reads and dequantizes its GGUF file, in fp32: loaded
    once per session (~25 s here, most of it transformers' GGUF reader), read-only."""
    return load_hf_model(default_model.path)


@pytest.fixture(scope="session")
def llama_cpp_ggufs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each tiny family llama.cpp runs (LLAMA_CPP_VARIANTS) as an HF folder and as the f16 GGUF
    llama.cpp's own converter writes from it: {variant: (hf_folder, gguf_file)}, made once per
    session (~10 s: one converter process). Skipped where the converter is not installed."""
    from tests.engine.llama_cpp_converter import convert_tiny_variants, require_converter

    require_converter()
    return convert_tiny_variants(tmp_path_factory.mktemp("llama-cpp-families"))
