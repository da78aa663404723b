"""Mixture-of-experts GGUF files (engine/loading/gguf.py, engine/models/moe_gguf.py): their
settings read as llama.cpp reads them, what Pagoda does not run refused in words."""

import pytest

from engine.errors import ModelLoadError
from engine.models.moe_gguf import (
    MAX_EXPERT_MATRICES,
    MAX_EXPERTS,
    mixtral_config,
    qwen2moe_config,
    qwen3moe_config,
)
from tests.engine.family_parity import FakeGGUFSettings

# As llama.cpp's converter writes a small Qwen3-MoE's settings.
_KEYS = {"embedding_length": 64, "attention.head_count": 4, "attention.head_count_kv": 2,
         "attention.key_length": 32, "block_count": 2, "feed_forward_length": 128,
         "context_length": 512, "rope.freq_base": 1000000.0, "expert_count": 8,
         "expert_used_count": 2, "expert_feed_forward_length": 32}


def _settings(architecture: str = "qwen3moe", tensors: tuple[str, ...] = (),
              **keys: object) -> FakeGGUFSettings:
    """keys: with "__" for "." (expert_weights_norm, rope__freq_base); None removes one."""
    stated = _KEYS | {k.replace("__", "."): v for k, v in keys.items()}
    metadata = {f"{architecture}.{k}": v for k, v in stated.items() if v is not None}
    return FakeGGUFSettings(architecture, metadata, {name: [0.0] for name in tensors})


def test_a_qwen3moe_file_routes_as_llama_cpp_does_whatever_the_original_config_said():
    """llama.cpp renormalises Qwen3-MoE's top k (as the released models' norm_topk_prob
    does); the converter keeps no such key, so the file cannot say otherwise."""
    config = qwen3moe_config(_settings())
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
            config.norm_topk_prob) == (8, 2, 32, True)
    assert (config.decoder_sparse_step, config.mlp_only_layers) == (1, [])
    assert (config.head_dim, config.intermediate_size) == (32, 128)


def test_a_qwen2moe_file_keeps_its_top_k_weights_and_has_a_shared_expert():
    config = qwen2moe_config(_settings("qwen2moe", expert_shared_feed_forward_length=48))
    assert (config.norm_topk_prob, config.shared_expert_intermediate_size) == (False, 48)


def test_a_llama_file_with_experts_is_a_mixtral_with_experts_of_the_feed_forward_width():
    config = mixtral_config(_settings("llama", expert_feed_forward_length=None))
    assert config.model_type == "mixtral"
    assert (config.num_local_experts, config.num_experts_per_tok, config.intermediate_size) == (
        8, 2, 128)


def test_a_file_without_an_expert_width_takes_llama_cpps_the_dense_width_over_k():
    assert qwen3moe_config(_settings(expert_feed_forward_length=None)).moe_intermediate_size == 64


@pytest.mark.parametrize(("keys", "words"), [
    ({"expert_count": MAX_EXPERTS + 1}, f"{MAX_EXPERTS + 1} experts in each of 2 layers"),
    ({"expert_count": 512, "block_count": MAX_EXPERT_MATRICES // 256},
     f"512 experts in each of {MAX_EXPERT_MATRICES // 256} layers"),
    ({"expert_used_count": 9}, "9 of its 8 experts"),
    ({"expert_count": None}, "qwen3moe.expert_count"),
    ({"expert_used_count": [2, 2]}, "qwen3moe.expert_used_count"),
])
def test_an_expert_count_out_of_bounds_is_refused_before_any_weight_is_named(keys, words):
    with pytest.raises(ModelLoadError, match=words):
        qwen3moe_config(_settings(**keys))


@pytest.mark.parametrize(("architecture", "keys", "tensors", "words"), [
    ("qwen3moe", {"expert_gating_func": 2}, (), "gating function 2"),
    ("qwen3moe", {"expert_weights_norm": False}, (), "not renormalised"),
    ("qwen2moe", {"expert_weights_norm": True}, (), "never renormalises"),
    ("qwen3moe", {"expert_weights_scale": 2.5}, (), "expert_weights_scale"),
    ("qwen3moe", {"expert_group_count": 8}, (), "groups of experts"),
    ("qwen3moe", {}, ("blk.0.ffn_gate_shexp.weight",), "shared expert"),
    ("llama", {}, (), "llama.expert_feed_forward_length"),
])
def test_a_file_routing_otherwise_than_llama_cpp_runs_it_is_refused_in_words(
        architecture, keys, tensors, words):
    build = {"qwen3moe": qwen3moe_config, "qwen2moe": qwen2moe_config,
             "llama": mixtral_config}[architecture]
    with pytest.raises(ModelLoadError, match=words):
        build(_settings(architecture, tensors, **keys))
