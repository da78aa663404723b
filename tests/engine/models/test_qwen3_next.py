"""Qwen3-Next (Qwen3.5's Gated DeltaNets and gated attention, with Qwen3-MoE's experts beside a
gated shared expert) runs as transformers defines it from a model folder and from the GGUF
llama.cpp's converter writes of it, with each sequence's DeltaNet states in a slot of its own:
whatever the chunking or the batch, a request gets the same greedy tokens.

The tiny model (tests/engine/tiny_models.py) is the tiny Qwen3.5's 8 layers (3 and 7 attend)
with in_proj_qkvz/in_proj_ba grouped by key head and 8 experts of 32 (top 2) in every layer.
"""

from dataclasses import replace

import pytest
import torch
import transformers

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.architecture import AttentionKind, GatedDeltaNetKind
from pagoda.engine.models.qwen3_next import architecture, config_from_gguf
from tests.engine.family_parity import (
    LLAMA_CPP_QUANTIZED_NEAR_TIE,
    assert_same_argmax,
    engine_logits,
    greedy_disagreements_with_llama_cpp,
    hf_logits,
    round_as_the_f16_file,
)
from tests.engine.hf_reference import load_hf_model
from tests.engine.llama_cpp_converter import (
    convert_to_gguf,
    gguf_model_name,
    quantize_with_llama_cpp,
)
from tests.engine.llama_cpp_references import llama_cpp_records
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts
from tests.engine.test_batch_invariance import SENTENCES
from tests.engine.tiny_models import save_tiny_model, tiny_config

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("qwen3_next"), "qwen3-next")


@pytest.fixture(scope="module")
def qwen3_next_gguf(qwen3_next):
    """llama.cpp's converter's f16 file of the tiny model."""
    return convert_to_gguf(qwen3_next, qwen3_next.parent / "tiny-qwen3-next.f16.gguf",
                           name=gguf_model_name("qwen3-next"))


@pytest.fixture(scope="module")
def prompts(qwen3_next) -> list[list[int]]:
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(qwen3_next))


@pytest.fixture(scope="module")
def hf_model(qwen3_next):
    return load_hf_model(qwen3_next)


@pytest.fixture(scope="module")
def long_prompts(qwen3_next) -> list[list[int]]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(qwen3_next)
    ids = [tokenizer.encode(f"Note {i}. " + " ".join(SENTENCES[i:] + SENTENCES[:i]) * 2)
           for i in range(4)]
    return [p[:n] for p, n in zip(ids, (200, 20, 97, 64), strict=True)]


def tokens(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, GREEDY)]


def test_qwen3_next_folder_predicts_transformers_next_token_at_every_position(
        qwen3_next, hf_model, prompts):
    """Within 3e-4: transformers' fp32 and ours are each up to 2.4e-4 from transformers run in
    float64 (eager experts) on these prompts, ours no further than transformers'."""
    for i, (ours, theirs) in enumerate(zip(engine_logits(qwen3_next, prompts),
                                           hf_logits(hf_model, prompts), strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=3e-4, rtol=1e-4)


def test_qwen3_next_greedy_through_the_scheduler_matches_transformers(qwen3_next, hf_model,
                                                                      prompts):
    llm = LLM(str(qwen3_next), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=16)
    assert_greedy_parity(llm, hf_model, prompts)
    pool = llm.engine.state_pool
    assert pool.num_free_slots == pool.num_slots


def test_qwen3_next_greedy_tokens_do_not_depend_on_the_chunk_or_the_batch(qwen3_next,
                                                                          long_prompts):
    one_by_one = LLM(str(qwen3_next), num_threads=NUM_THREADS, num_kv_blocks=64)
    alone = [tokens(one_by_one, [p])[0] for p in long_prompts]
    chunked = LLM(str(qwen3_next), num_threads=NUM_THREADS, num_kv_blocks=64,
                  max_num_batched_tokens=7)
    assert tokens(chunked, long_prompts) == alone


def test_qwen3_next_layers_are_qwen3_5s_with_experts_in_every_layer():
    arch = architecture(tiny_config("qwen3-next", vocab_size=64))
    assert arch.layers[3] == AttentionKind(output_gate=True)
    assert arch.layers[0] == GatedDeltaNetKind(num_k_heads=2, num_v_heads=4, k_dim=16, v_dim=16,
                                               conv_kernel=4, layout="qwen3_next")
    assert arch.moe.sparse_layers == frozenset(range(8))
    assert arch.moe.shared_expert_gate and arch.moe.renormalize
    assert arch.norm_offset == 1.0


def test_qwen3_next_gguf_gives_the_folders_logits_to_fp16_rounding(qwen3_next, qwen3_next_gguf,
                                                                  prompts):
    """The converter splits in_proj_qkvz into attn_qkv and attn_gate and keeps in_proj_ba whole
    (ssm_ba, grouped by key head), the value heads in Hugging Face's order; within the
    folder's own 3e-4 (above)."""
    reference = round_as_the_f16_file(load_hf_model(qwen3_next))
    for ours, theirs in zip(engine_logits(qwen3_next_gguf, prompts),
                            hf_logits(reference, prompts), strict=True):
        torch.testing.assert_close(ours, theirs, atol=3e-4, rtol=1e-4)


def test_qwen3_next_gguf_config_states_what_the_folders_does(qwen3_next, qwen3_next_gguf):
    want = architecture(transformers.AutoConfig.from_pretrained(qwen3_next))
    got = architecture(config_from_gguf(GGUFModelFile(qwen3_next_gguf)))
    assert got.shape.rms_norm_eps == pytest.approx(want.shape.rms_norm_eps)  # a float32 key
    assert replace(got.shape, rms_norm_eps=want.shape.rms_norm_eps) == want.shape
    assert got.layers == tuple(replace(kind, layout="qwen3_next_split")
                               if isinstance(kind, GatedDeltaNetKind) else kind
                               for kind in want.layers)
    assert got.moe == want.moe
    assert got.ropes["default"].rotary_dim == want.ropes["default"].rotary_dim


def test_qwen3_next_gguf_greedy_tokens_equal_llama_cpps(qwen3_next_gguf):
    record, = llama_cpp_records("tiny_hybrid.json", family="qwen3-next", type="f16")
    assert not greedy_disagreements_with_llama_cpp(qwen3_next_gguf, record)


@pytest.mark.xfail(strict=True, reason=(
    "The tiny Qwen3-Next is too sensitive for a quantized file's tokens to be compared: 0.4% "
    "noise on its matrices moves transformers' last logits by up to 4.4 (the tiny Qwen3.5's by "
    "up to 1.0), so llama.cpp's 8-bit activations alone can change a token. On Q4_K_M "
    "llama.cpp's first token of prompt 2 is 1.31 behind our best on the file's weights; the "
    "f16 file agrees, and ours is the same with blocks kept or dequantized"))
def test_qwen3_next_q4_k_m_greedy_tokens_equal_llama_cpps(qwen3_next_gguf, tmp_path):
    q4 = quantize_with_llama_cpp(qwen3_next_gguf, tmp_path / "tiny-qwen3-next.Q4_K_M.gguf")
    record, = llama_cpp_records("tiny_hybrid.json", family="qwen3-next", type="Q4_K_M")
    assert not greedy_disagreements_with_llama_cpp(q4, record, LLAMA_CPP_QUANTIZED_NEAR_TIE)
