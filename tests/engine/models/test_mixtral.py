"""Mixtral runs as transformers defines it, from a folder in Mixtral's own names
(block_sparse_moe.gate, block_sparse_moe.experts.E.w1/w3/w2) and from one in transformers 5's
fused layout. The tiny model (tests/engine/tiny_models.py, "mixtral") routes each token to 2 of
8 experts in every layer, renormalised."""

import pytest
import torch
import transformers
from safetensors import safe_open
from tiny_models import save_tiny_model

from pagoda.engine import LLM
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.models.mixtral import architecture
from tests.engine.family_parity import assert_same_argmax, engine_logits, hf_logits
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("mixtral"), "mixtral")


@pytest.fixture(scope="module")
def hf_model(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(folder) -> list[list[int]]:
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(folder))


def test_the_tiny_mixtral_folder_keeps_mixtrals_own_expert_names(folder):
    with safe_open(folder / "model.safetensors", framework="pt") as tensors:
        names = set(tensors.keys())
    assert {"model.layers.0.block_sparse_moe.gate.weight",
            "model.layers.0.block_sparse_moe.experts.7.w3.weight"} <= names
    assert not any(".mlp." in name for name in names)


def test_mixtral_folder_predicts_transformers_next_token_at_every_position(
        folder, hf_model, prompts):
    some = [prompts[0], prompts[6]]  # a chat in English, a raw text in code
    for i, (ours, theirs) in enumerate(zip(engine_logits(folder, some),
                                           hf_logits(hf_model, some), strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_mixtral_greedy_through_a_batch_matches_transformers(folder, hf_model, prompts):
    llm = LLM(str(folder), num_kv_blocks=128, num_threads=NUM_THREADS)
    assert_greedy_parity(llm, hf_model, prompts)


def test_a_mixtral_folder_in_transformers_fused_layout_predicts_the_same(
        folder, hf_model, prompts, tmp_path):
    hf_model.save_pretrained(tmp_path, save_original_format=False)
    transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path)
    for fused, own in zip(engine_logits(tmp_path, prompts[:2]),
                          engine_logits(folder, prompts[:2]), strict=True):
        torch.testing.assert_close(fused, own, atol=1e-5, rtol=1e-5)


def test_mixtral_renormalises_its_top_two_in_every_layer(folder):
    moe = architecture(transformers.AutoConfig.from_pretrained(folder)).moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (8, 2, 64)
    assert moe.renormalize and moe.sparse_layers == {0, 1, 2}


def test_a_mixtral_config_routing_to_more_experts_than_it_has_is_refused():
    config = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=6)
    with pytest.raises(ModelLoadError, match="6 \\(num_experts_per_tok\\) of 4"):
        architecture(config)
