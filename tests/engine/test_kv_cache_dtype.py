"""EngineConfig.kv_cache_dtype: a half-width KV pool takes half the memory and predicts what the
fp32 pool does within the quantized path's own bars (tests/engine/quantization/test_quantization.py)."""

from pathlib import Path

import pytest
import torch

from pagoda.engine import SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.worker.evaluation import compare, prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner

QUALITY_TEXT = Path(__file__).parent / "data" / "quality_text.txt"
HALF_DTYPES = ["float16", "bfloat16"]
ENGINE = {"num_kv_blocks": 64, "num_threads": 1}


def test_unknown_kv_cache_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="kv_cache_dtype='int8' must be one of auto, float32, "
                                         "bfloat16, float16"):
        EngineConfig(kv_cache_dtype="int8")


def test_auto_keeps_the_compute_dtype(make_llm):
    assert make_llm(**ENGINE).engine.runner.kv_caches[0][0].dtype == torch.float32


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_kv_cache_takes_half_the_bytes_per_block(make_llm, dtype):
    full = make_llm(**ENGINE).engine.runner
    half = make_llm(**ENGINE, kv_cache_dtype=dtype).engine.runner
    assert half.kv_caches[0][0].dtype == getattr(torch, dtype)
    assert 2 * half.bytes_per_block() == full.bytes_per_block()


@pytest.fixture(scope="module")
def text_ids(default_model) -> list[int]:
    return default_model.tokenizer.encode(QUALITY_TEXT.read_text(encoding="utf-8"))[:512]


def _chunked_logits(default_model, text_ids, kv_cache_dtype: str) -> torch.Tensor:
    """Chunks of 64: every chunk after the first attends keys and values read from the pool."""
    config = EngineConfig(num_kv_blocks=40, num_threads=1, kv_cache_dtype=kv_cache_dtype)
    return prompt_logits(ModelRunner(default_model, config), text_ids, chunk=64)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_kv_cache_predicts_like_the_fp32_cache(default_model, text_ids, dtype):
    want = _chunked_logits(default_model, text_ids, "float32")
    got = _chunked_logits(default_model, text_ids, dtype)
    assert not torch.equal(got, want)  # the pool really is narrower
    report = compare(want, got, text_ids)
    assert report.top1_agreement >= 0.98
    assert abs(report.perplexity_ratio - 1) < 0.02


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_kv_cache_decodes_the_same_greedy_reply(make_llm, dtype):
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    want = make_llm(**ENGINE).chat(chat, params).outputs[0].token_ids
    got = make_llm(**ENGINE, kv_cache_dtype=dtype).chat(chat, params).outputs[0].token_ids
    assert got == want


def test_a_kv_cache_dtype_the_triton_kernels_do_not_read_is_refused(make_llm):
    with pytest.raises(ValueError, match="kv_cache_dtype='float16' differs from the compute "
                                         "dtype .* leave kv_cache_dtype at 'auto'"):
        make_llm(**ENGINE, kernel_backend="triton", kv_cache_dtype="float16")
