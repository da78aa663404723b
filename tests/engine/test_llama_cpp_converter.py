"""What llama.cpp's own converter writes for each tiny family: the files our loader must read.

The GGUF files come from the session fixture llama_cpp_ggufs (tests/engine/conftest.py); each
claim here is one a family's loader relies on, checked with gguf-py's reader (through
open_gguf_reader, which reads a 49k-token vocabulary several times faster).
"""

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file
from tiny_models import tiny_config

from pagoda.engine.loading.gguf import open_gguf_reader
from tests.engine.llama_cpp_converter import LLAMA_CPP_VARIANTS
from tests.engine.llama_cpp_references import llama_cpp_records, sha256

# The session's tiny models and their conversion (~15 s on a quiet 2-core machine: one converter
# process for all four) come with whichever of these runs first; the families' tests share them.
pytestmark = pytest.mark.slow

ARCHITECTURES = {"gemma2": "gemma2", "gemma3": "gemma3", "gemma4": "gemma4", "gemma4-e2b": "gemma4", "phi3": "phi3",
                 "phi3-longrope": "phi3", "smollm3": "smollm3"}
_LLAMA_BLOCK = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}
# Per block, by GGUF name (each with ".weight"). Phi-3 fuses q, k, v into attn_qkv and gate and
# up into ffn_up; Gemma 2 adds a norm after attention and after the MLP, Gemma 3 q/k norms too.
BLOCK_TENSORS = {
    "gemma2": _LLAMA_BLOCK | {"post_attention_norm", "post_ffw_norm"},
    "gemma3": _LLAMA_BLOCK | {"attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"},
    "phi3": {"attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down"},
    "smollm3": _LLAMA_BLOCK,
}
_GEMMA4_BLOCK = BLOCK_TENSORS["gemma3"] | {"layer_output_scale"}
# Gemma 4's blocks differ by layer: no attn_v on the global layers (2, 5) whose values are their
# keys; in the E2B-shaped one the last two layers read layers 2 and 3's KV caches (no attn_k,
# attn_v or attn_k_norm) and every block has its per-layer input's gate, projection and norm.
LAYER_TENSORS = {
    "gemma4": lambda i: _GEMMA4_BLOCK - ({"attn_v"} if i in (2, 5) else set()),
    "gemma4-e2b": lambda i: (_GEMMA4_BLOCK | {"inp_gate", "proj", "post_norm"})
    - ({"attn_k", "attn_v", "attn_k_norm"} if i >= 4 else set()),
}
# Outside the blocks: tied models have no output.weight; longrope's factors are tensors, and so
# are Gemma 4's global layers' rotated share (rope_freqs).
GLOBAL_TENSORS = {
    "gemma2": {"token_embd", "output_norm"},
    "gemma3": {"token_embd", "output_norm"},
    "gemma4": {"token_embd", "output_norm", "rope_freqs"},
    "gemma4-e2b": {"token_embd", "output_norm", "rope_freqs", "per_layer_token_embd",
                   "per_layer_model_proj", "per_layer_proj_norm"},
    "phi3": {"token_embd", "output_norm"},
    "phi3-longrope": {"token_embd", "output_norm", "output", "rope_factors_long", "rope_factors_short"},
    "smollm3": {"token_embd", "output_norm"},
}


@pytest.fixture(scope="module")
def readers(llama_cpp_ggufs) -> dict[str, gguf.GGUFReader]:
    return {variant: open_gguf_reader(gguf_file) for variant, (_, gguf_file) in llama_cpp_ggufs.items()}


def field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def tensor(reader: gguf.GGUFReader, name: str) -> np.ndarray:
    return np.asarray(next(t for t in reader.tensors if t.name == name).data)


@pytest.mark.parametrize("variant", LLAMA_CPP_VARIANTS)
def test_each_family_is_written_under_its_architecture_with_its_tensors(readers, variant):
    reader = readers[variant]
    arch = ARCHITECTURES[variant]
    layers = tiny_config(variant, vocab_size=1).num_hidden_layers

    assert field(reader, "general.architecture") == arch
    assert field(reader, f"{arch}.block_count") == layers
    blocks = LAYER_TENSORS.get(variant, lambda i: BLOCK_TENSORS[arch])
    want = {f"{g}.weight" for g in GLOBAL_TENSORS[variant]} | {
        f"blk.{i}.{name}.weight" for i in range(layers) for name in blocks(i)}
    assert {t.name for t in reader.tensors} == want


def test_gemma3_norms_are_written_as_one_plus_the_hf_weight_with_their_gemma_names(llama_cpp_ggufs, readers):
    """Gemma multiplies by (1 + w); the converter stores 1 + w, so a loader must not add 1 again.
    Its ffn_norm is the norm before the MLP and post_attention_norm the one after attention
    (Llama's post_attention_layernorm is the GGUF ffn_norm: the names do not carry over)."""
    hf = load_file(llama_cpp_ggufs["gemma3"][0] / "model.safetensors")
    reader = readers["gemma3"]
    pairs = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
             "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
             "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
    for ours, theirs in pairs.items():
        np.testing.assert_allclose(tensor(reader, f"blk.2.{ours}.weight"),
                                   1 + hf[f"model.layers.2.{theirs}.weight"], rtol=1e-6)
    np.testing.assert_allclose(tensor(reader, "output_norm.weight"), 1 + hf["model.norm.weight"],
                               rtol=1e-6)


def test_gemma4_norms_and_layer_scalars_are_written_as_the_hf_weights(llama_cpp_ggufs, readers):
    """Gemma 4's norms multiply by w (no 1 + w): the converter stores w as it is."""
    hf = load_file(llama_cpp_ggufs["gemma4"][0] / "model.safetensors")
    reader = readers["gemma4"]
    for ours, theirs in {"post_attention_norm": "post_attention_layernorm",
                         "ffn_norm": "pre_feedforward_layernorm",
                         "layer_output_scale": "layer_scalar"}.items():
        name = f"model.layers.2.{theirs}" + ("" if theirs == "layer_scalar" else ".weight")
        np.testing.assert_array_equal(tensor(reader, f"blk.2.{ours}.weight"), hf[name])


def test_gemma4_global_layers_head_size_kv_heads_and_rotated_share_are_in_the_file(readers):
    reader = readers["gemma4"]
    assert field(reader, "gemma4.attention.key_length") == 96
    assert field(reader, "gemma4.attention.key_length_swa") == 32
    assert field(reader, "gemma4.attention.head_count_kv") == [2, 2, 1, 2, 2, 1]
    # A quarter of the 48 pairs rotate; llama.cpp divides the others' frequencies by 1e30.
    np.testing.assert_array_equal(tensor(reader, "rope_freqs.weight"),
                                  np.array([1.0] * 12 + [1e30] * 36, dtype=np.float32))


def test_gemma3_window_and_both_rope_bases_are_in_the_file(readers):
    reader = readers["gemma3"]
    config = tiny_config("gemma3", vocab_size=1)

    assert field(reader, "gemma3.attention.sliding_window") == config.sliding_window
    assert field(reader, "gemma3.rope.freq_base_swa") == config.rope_parameters["sliding_attention"]["rope_theta"]
    assert field(reader, "gemma3.rope.freq_base") == config.rope_parameters["full_attention"]["rope_theta"]
    assert field(reader, "gemma3.attention.key_length") == config.head_dim
    assert field(reader, "gemma3.final_logit_softcapping") == config.final_logit_softcapping


def test_phi3_partial_rotary_and_longrope_factors_are_in_the_file(readers):
    reader = readers["phi3-longrope"]
    rope = tiny_config("phi3-longrope", vocab_size=1).rope_parameters
    head_dim = 64 // 4

    assert field(reader, "phi3.rope.dimension_count") == int(head_dim * rope["partial_rotary_factor"])
    assert field(reader, "phi3.rope.scaling.original_context_length") == rope["original_max_position_embeddings"]
    np.testing.assert_allclose(tensor(reader, "rope_factors_long.weight"), rope["long_factor"])
    np.testing.assert_allclose(tensor(reader, "rope_factors_short.weight"), rope["short_factor"])
    # sqrt(1 + ln(4096 / 256) / ln(256)), transformers' longrope attention factor
    assert field(reader, "phi3.rope.scaling.attn_factor") == pytest.approx(1.5 ** 0.5)


@pytest.mark.parametrize("variant", LLAMA_CPP_VARIANTS)
def test_our_conversion_is_the_file_llama_cpps_tokens_were_recorded_on(llama_cpp_ggufs, variant):
    """The tiny weights are drawn the same on every CPU and the converter is pinned, so the
    recorded tokens (tests/engine/data/llama_cpp/tiny_families.json) belong to this file."""
    recorded = {r.sha256 for r in llama_cpp_records("tiny_families.json", family=variant, type="f16")}
    assert recorded, f"no llama.cpp record of {variant}: run tests/engine/data/llama_cpp/record.py"
    assert {sha256(llama_cpp_ggufs[variant][1])} == recorded, (
        f"{variant}'s f16 GGUF is not the one llama.cpp was recorded on: the tiny model, its "
        "tokenizer or the converter changed; rerun tests/engine/data/llama_cpp/record.py "
        "(docs/ENGINE.md, 'Testing families against llama.cpp')")
