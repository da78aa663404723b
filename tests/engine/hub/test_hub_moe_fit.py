"""A mixture of experts on the Hub, before it is downloaded: its config.json tells how many of the
Hub's parameters are routed experts, so the fit counts the parameters a token reads and a GGUF
file's experts at the file's bytes, memory-mapped as the loader keeps them."""

import pytest

from pagoda.engine.hub.fit import estimate_fit, experts_of

GIB = 1 << 30
KV = 1 << 30
# Qwen3-30B-A3B's config.json, the keys the count reads, and the Hub's count of its parameters.
A3B_CONFIG = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
              "moe_intermediate_size": 768, "intermediate_size": 6144, "num_experts": 128,
              "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": []}
A3B_PARAMETERS = 30_532_122_624
A3B_EXPERTS = 48 * 128 * 3 * 2048 * 768
A3B_Q4_K_M_BYTES = 18_556_685_024


def test_a_30b_a3b_q4_k_m_counts_3_4b_active_parameters_and_opens_on_24_gib():
    fit = estimate_fit("Q4_K_M", A3B_Q4_K_M_BYTES, A3B_PARAMETERS, "gguf", KV,
                       available=20 * GIB, total=24 * GIB, experts=experts_of(A3B_CONFIG))

    assert fit.num_active_parameters == A3B_PARAMETERS - A3B_EXPERTS * 120 // 128
    assert round(fit.num_active_parameters / 1e9, 1) == 3.4
    assert fit.mapped_bytes == round(A3B_Q4_K_M_BYTES * A3B_EXPERTS / A3B_PARAMETERS)
    assert fit.verdict == "fits"


def test_mapped_experts_take_the_files_bytes_not_a_converted_copys():
    dense = estimate_fit("Q4_K_M", A3B_Q4_K_M_BYTES, A3B_PARAMETERS, "gguf", KV,
                         available=20 * GIB, total=24 * GIB)
    moe = estimate_fit("Q4_K_M", A3B_Q4_K_M_BYTES, A3B_PARAMETERS, "gguf", KV,
                       available=20 * GIB, total=24 * GIB, experts=experts_of(A3B_CONFIG))

    assert moe.weight_bytes < dense.weight_bytes  # Q4_K as the file has it, not int4 + scales
    assert moe.weight_bytes == pytest.approx(A3B_Q4_K_M_BYTES, rel=0.05)


def test_a_folders_experts_are_converted_so_none_is_mapped():
    fit = estimate_fit("BF16", 2 * A3B_PARAMETERS, A3B_PARAMETERS, "safetensors", KV,
                       available=20 * GIB, total=24 * GIB, experts=experts_of(A3B_CONFIG))

    assert fit.mapped_bytes == 0
    assert fit.num_active_parameters == A3B_PARAMETERS - A3B_EXPERTS * 120 // 128
    assert fit.verdict == "too_big"


def test_a_dense_model_reads_all_its_parameters():
    dense_config = {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
                    "intermediate_size": 18944}

    fit = estimate_fit("Q4_K_M", 4_680_000_000, 7_600_000_000, "gguf", KV,
                       experts=experts_of(dense_config))

    assert experts_of(dense_config) is None
    assert (fit.num_active_parameters, fit.mapped_bytes) == (7_600_000_000, 0)


def test_a_config_that_counts_more_experts_than_the_hubs_total_is_counted_dense():
    fit = estimate_fit("Q4_K_M", 4_680_000_000, 7_600_000_000, "gguf", KV,
                       experts=experts_of(A3B_CONFIG))

    assert (fit.num_active_parameters, fit.mapped_bytes) == (7_600_000_000, 0)


@pytest.mark.parametrize("config", [None, {"num_experts": 8, "num_experts_per_tok": 20},
                                    {"num_experts": 8, "num_experts_per_tok": 2}])
def test_experts_that_cannot_be_counted_leave_the_model_counted_dense(config):
    assert experts_of(config) is None
