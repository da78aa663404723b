"""On CPU the engine runs a step's norms, rope, SiLU, KV writes and decode attention in our C
kernels (pagoda/kernels/cpu/decode_ops.c) and decodes greedily the same tokens as with torch's."""

import pytest

from pagoda.engine import LLM, SamplingParams
from pagoda.kernels.cpu import native
from pagoda.kernels.kernel_ops import TORCH_OPS

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Then the dog",
    "def quicksort(items):\n    if len(items) <= 1:\n        return items\n",
    "北京是中国的首都，也是一座历史悠久的城市。",
]


def _greedy(folder, **config) -> tuple[list[list[int]], object]:
    llm = LLM(str(folder), num_kv_blocks=64, num_threads=1, **config)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=40,
                                                   ignore_eos=True))
    return [o.outputs[0].token_ids for o in outputs], llm.engine.runner.model.ops


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "float16"])
def test_c_decode_ops_give_torchs_greedy_tokens(tiny_model_folder, monkeypatch, kernels_cache_dir,
                                                kv_cache_dtype):
    if native.find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC)")
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(kernels_cache_dir))
    ours, ops = _greedy(tiny_model_folder, kv_cache_dtype=kv_cache_dtype)
    assert ops.paged_attention != TORCH_OPS.paged_attention
    monkeypatch.setenv("PAGODA_NATIVE_KERNELS", "0")
    torchs, ops = _greedy(tiny_model_folder, kv_cache_dtype=kv_cache_dtype)
    assert ops is TORCH_OPS
    assert ours == torchs
