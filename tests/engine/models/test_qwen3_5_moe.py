"""Qwen3.5-MoE (Qwen3.5's Gated DeltaNets and gated attention, experts beside a gated shared
expert in every layer) runs as transformers defines it from a text folder, from the multimodal
folder it is released as, and from the GGUF llama.cpp's converter writes of it (qwen35moe).

The tiny model (tests/engine/tiny_models.py) is the tiny Qwen3.5's 8 layers (3 and 7 attend)
with 8 experts of 32 (top 2, renormalised) and a shared expert of 48 in every layer.
"""

from dataclasses import replace

import pytest
import torch
import transformers

from pagoda.engine import LLM
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.architecture import GatedDeltaNetKind
from pagoda.engine.models.qwen3_5_moe import architecture, config_from_gguf
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
from tests.engine.multimodal_folders import save_as_multimodal
from tests.engine.tiny_models import save_tiny_model, tiny_config


@pytest.fixture(scope="module")
def qwen35_moe(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("qwen35_moe"), "qwen3.5-moe")


@pytest.fixture(scope="module")
def qwen35_moe_gguf(qwen35_moe):
    """llama.cpp's converter's f16 file of the tiny model."""
    return convert_to_gguf(qwen35_moe, qwen35_moe.parent / "tiny-qwen3.5-moe.f16.gguf",
                           name=gguf_model_name("qwen3.5-moe"))


@pytest.fixture(scope="module")
def prompts(qwen35_moe) -> list[list[int]]:
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(qwen35_moe))


@pytest.fixture(scope="module")
def hf_model(qwen35_moe):
    return load_hf_model(qwen35_moe)


def test_qwen3_5_moe_folder_predicts_transformers_next_token_at_every_position(
        qwen35_moe, hf_model, prompts):
    """Within 3e-4 as Qwen3-Next's (its experts summed in another order than transformers')."""
    for i, (ours, theirs) in enumerate(zip(engine_logits(qwen35_moe, prompts),
                                           hf_logits(hf_model, prompts), strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=3e-4, rtol=1e-4)


def test_qwen3_5_moe_greedy_through_the_scheduler_matches_transformers(qwen35_moe, hf_model,
                                                                       prompts):
    llm = LLM(str(qwen35_moe), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=16)
    assert_greedy_parity(llm, hf_model, prompts)
    pool = llm.engine.state_pool
    assert pool.num_free_slots == pool.num_slots


def test_qwen3_5_moe_routes_every_layer_and_renormalises():
    arch = architecture(tiny_config("qwen3.5-moe", vocab_size=64))
    assert arch.moe.sparse_layers == frozenset(range(8))
    assert arch.moe.renormalize and arch.moe.shared_expert_gate
    assert arch.moe.shared_expert_size == 48


def test_qwen3_5_moe_gguf_gives_the_folders_logits_to_fp16_rounding(qwen35_moe, qwen35_moe_gguf,
                                                                    prompts):
    """Its DeltaNets' value heads tiled by the converter as Qwen3.5's, its experts stacked as
    Qwen3-Next's (ffn_*_exps, the shared expert's gate ffn_gate_inp_shexp)."""
    reference = round_as_the_f16_file(load_hf_model(qwen35_moe))
    for ours, theirs in zip(engine_logits(qwen35_moe_gguf, prompts),
                            hf_logits(reference, prompts), strict=True):
        torch.testing.assert_close(ours, theirs, atol=3e-4, rtol=1e-4)


def test_qwen3_5_moe_gguf_config_states_what_the_folders_does(qwen35_moe, qwen35_moe_gguf):
    want = architecture(transformers.AutoConfig.from_pretrained(qwen35_moe))
    got = architecture(config_from_gguf(GGUFModelFile(qwen35_moe_gguf)))
    assert got.shape.rms_norm_eps == pytest.approx(want.shape.rms_norm_eps)  # a float32 key
    assert replace(got.shape, rms_norm_eps=want.shape.rms_norm_eps) == want.shape
    assert got.layers == tuple(replace(kind, tiled=True) if isinstance(kind, GatedDeltaNetKind)
                               else kind for kind in want.layers)
    assert got.moe == want.moe
    assert got.ropes["default"].rotary_dim == want.ropes["default"].rotary_dim


# The tiny hybrid mixture of experts amplifies rounding as the tiny Qwen3-Next does: on prompt 4
# llama.cpp's f16 run puts its first token 0.053 ahead of the next, where transformers on the
# file's own weights (fp32 activations) ranks that token third, 0.095 behind its best (ours),
# whose lead over the second is 0.033. Gaps up to 0.1 count as ties here.
_F16_NEAR_TIE = 0.1


def test_qwen3_5_moe_gguf_greedy_tokens_equal_llama_cpps(qwen35_moe_gguf):
    record, = llama_cpp_records("tiny_hybrid.json", family="qwen3.5-moe", type="f16")
    assert not greedy_disagreements_with_llama_cpp(qwen35_moe_gguf, record, _F16_NEAR_TIE)


@pytest.mark.xfail(strict=True, reason=(
    "The tiny Qwen3.5-MoE is too sensitive for a quantized file's tokens to be compared, as the "
    "tiny Qwen3-Next is (tests/engine/models/test_qwen3_next.py): on Q4_K_M llama.cpp's first "
    "token of prompt 3 leads by 0.27, ours by 0.075 is another; the f16 file agrees"))
def test_qwen3_5_moe_q4_k_m_greedy_tokens_equal_llama_cpps(qwen35_moe_gguf, tmp_path):
    q4 = quantize_with_llama_cpp(qwen35_moe_gguf, tmp_path / "tiny-qwen3.5-moe.Q4_K_M.gguf")
    record, = llama_cpp_records("tiny_hybrid.json", family="qwen3.5-moe", type="Q4_K_M")
    assert not greedy_disagreements_with_llama_cpp(q4, record, LLAMA_CPP_QUANTIZED_NEAR_TIE)


@pytest.fixture(scope="module")
def multimodal(qwen35_moe, tmp_path_factory):
    """The tiny model as Qwen3.5-MoE is released: Qwen3_5MoeForConditionalGeneration (a small
    vision encoder beside it), the text model's weights the tiny folder's."""
    return save_as_multimodal(qwen35_moe, tmp_path_factory.mktemp("qwen35_moe_multimodal"),
                              transformers.Qwen3_5MoeConfig,
                              transformers.Qwen3_5MoeForConditionalGeneration)


def test_a_qwen3_5_moe_multimodal_folder_runs_its_text_model(multimodal, hf_model, prompts):
    """Its weights under model.language_model., each layer's experts in two 3-D tensors, read
    as the text folder's; the vision encoder not read."""
    assert transformers.AutoConfig.from_pretrained(multimodal).model_type == "qwen3_5_moe"
    for ours, theirs in zip(engine_logits(multimodal, prompts), hf_logits(hf_model, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=3e-4, rtol=1e-4)
