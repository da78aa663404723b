"""Qwen3.5-MoE (Qwen3.5's Gated DeltaNets and gated attention, experts beside a gated shared
expert in every layer) runs as transformers defines it from a text folder.

The tiny model (tests/engine/tiny_models.py) is the tiny Qwen3.5's 8 layers (3 and 7 attend)
with 8 experts of 32 (top 2, renormalised) and a shared expert of 48 in every layer.
"""

import pytest
import torch
import transformers

from pagoda.engine import LLM
from pagoda.engine.models.qwen3_5_moe import architecture
from tests.engine.family_parity import assert_same_argmax, engine_logits, hf_logits
from tests.engine.hf_reference import load_hf_model
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts
from tests.engine.tiny_models import save_tiny_model, tiny_config


@pytest.fixture(scope="module")
def qwen35_moe(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("qwen35_moe"), "qwen3.5-moe")


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
