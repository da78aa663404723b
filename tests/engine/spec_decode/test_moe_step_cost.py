"""A mixture of experts' step costs by the distinct experts its rows read, not by its rows: the
step cost table is interpolated and extrapolated in that measure, so drafts that a dense model's
table would refuse can pay on a batch of an MoE model, whose extra rows mostly read experts
already read."""

from dataclasses import replace

import pytest
from transformers import LlamaConfig

from pagoda.engine.models.architecture import MoESpec, sparse_layers
from pagoda.engine.models.registry import architecture_of
from pagoda.engine.spec_decode.draft_policy import DraftCandidate, plan_drafts
from pagoda.engine.spec_decode.step_cost import ExpertStepWork, StepCost
from pagoda.engine.worker.calibration import step_work

A3B = ExpertStepWork(num_experts=128, top_k=8, dense_share=0.4)
# Measured at 1-3 rows where each more row costs nearly a whole step (a compute-bound CPU).
COMPUTE_BOUND = {1: 0.0104, 2: 0.0204, 3: 0.0304}


def _distinct(rows: int, experts: int = 128, top_k: int = 8) -> float:
    return experts * (1 - (1 - top_k / experts) ** rows)


def test_distinct_experts_grow_from_top_k_to_all_of_them():
    assert A3B.distinct_experts(1) == pytest.approx(8)
    assert A3B.distinct_experts(2) == pytest.approx(8 + 8 * 120 / 128)
    assert 127 < A3B.distinct_experts(256) < 128


def test_one_row_is_one_rows_worth_and_more_rows_are_worth_fewer():
    assert A3B(1) == pytest.approx(1.0)
    assert A3B(32) == pytest.approx(0.4 * 32 + 0.6 * _distinct(32) / 8)
    assert A3B(32) < 22
    # every row reads every expert: they are read once, whatever the rows
    assert ExpertStepWork(8, 8, 0.4)(5) == pytest.approx(0.4 * 5 + 0.6)
    assert ExpertStepWork(128, 8, 1.0)(5) == pytest.approx(5)  # no experts: rows as they are


def test_beyond_the_measured_rows_an_moe_step_follows_the_experts_it_reads():
    cost = StepCost(COMPUTE_BOUND, work=A3B)

    slope = 0.010 / (A3B(3) - A3B(2))
    assert cost.seconds(3) == 0.0304
    assert cost.seconds(32) == pytest.approx(0.0304 + slope * (A3B(32) - A3B(3)))
    assert cost.seconds(32) < StepCost(COMPUTE_BOUND).seconds(32) * 0.75


def test_drafts_a_dense_table_refuses_pay_on_an_moe_batch():
    candidates = [DraftCandidate(0.95, 1)] * 8

    dense = plan_drafts(StepCost(COMPUTE_BOUND), 8, 8, candidates, 512)
    moe = plan_drafts(StepCost(COMPUTE_BOUND, work=A3B), 8, 8, candidates, 512)

    assert dense.total == 0
    assert moe.total == 8 and moe.speedup > 1.05


def test_a_models_dense_share_is_what_a_token_reads_outside_its_routed_experts():
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         tie_word_embeddings=False)
    dense = architecture_of(config)
    moe = replace(dense, moe=MoESpec(num_experts=16, top_k=4, intermediate_size=32,
                                     sparse_layers=sparse_layers(4, every=2)))

    attention = 4 * 2 * 64 * (64 + 32)
    mlps = 2 * 3 * 64 * 128 + 2 * 16 * 64  # two dense layers' MLPs, two routers
    norms = 4 * 2 * 64 + 64
    routed_read = 2 * 4 * 3 * 64 * 32  # top 4 experts of the two sparse layers
    read = attention + mlps + norms + 256 * 64 + routed_read  # lm_head, not the token table
    assert step_work(dense) is None
    work = step_work(moe)
    assert (work.num_experts, work.top_k) == (16, 4)
    assert work.dense_share == pytest.approx(1 - routed_read / read)
