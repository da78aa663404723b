"""A mixture of experts is sized twice from its headers: every expert (on disk, memory-mapped) and
what one token reads (top_k of E experts); the fit check lets the mapped experts live in the page
cache. Files here are real GGUF headers over a hole (tests/engine/moe_header_gguf.py)."""

import json
import logging

import pytest
import torch
from gguf import GGMLQuantizationType as QType
from safetensors.torch import save_file

from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.expert_footprint import (
    ExpertRouting,
    expert_parameters,
    is_expert_tensor,
    routing_from_config,
)
from pagoda.engine.loading.model_info import (
    GIB,
    INT4_BYTES_PER_ELEMENT,
    ModelHeaders,
    check_fits_memory,
    describe_headers,
    read_model_headers,
)
from pagoda.engine.models.kv_cache_sizing import AUTO_KV_CACHE_LIMIT, model_kv_cache_bytes
from tests.engine.moe_header_gguf import (
    QWEN3_30B_A3B,
    TINY_MIXTRAL,
    MoEShape,
    write_moe_header_gguf,
)

Q4_K_BYTES = 144 / 256


def _expert_parameters(s: MoEShape) -> int:
    return s.layers * 3 * s.experts * s.expert_width * s.hidden


def _total_parameters(s: MoEShape) -> int:
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = s.layers * 2 * s.hidden * (q + kv)
    router = s.layers * s.experts * s.hidden
    norms = s.layers * 2 * s.hidden + s.hidden
    if s.architecture == "qwen3moe":
        norms += s.layers * 2 * s.head_dim
    return attention + router + norms + 2 * s.vocab * s.hidden + _expert_parameters(s)


@pytest.fixture(scope="module")
def a3b_headers(tmp_path_factory) -> ModelHeaders:
    path = write_moe_header_gguf(tmp_path_factory.mktemp("a3b") / "a3b.gguf", QWEN3_30B_A3B)
    return read_model_headers(path)


@pytest.fixture(scope="module")
def a3b(a3b_headers):
    return describe_headers(a3b_headers)


def test_a_30b_a3b_file_has_30_5b_parameters_and_reads_3_4b_a_token(a3b):
    total, experts = _total_parameters(QWEN3_30B_A3B), _expert_parameters(QWEN3_30B_A3B)

    assert a3b.routing == ExpertRouting(num_experts=128, num_used=8)
    assert a3b.num_parameters == total
    assert a3b.num_active_parameters == total - experts + experts * 8 // 128
    assert round(a3b.num_parameters / 1e9, 1) == 30.5
    assert round(a3b.num_active_parameters / 1e9, 1) == 3.4


def test_its_experts_stay_mapped_at_the_files_bytes(a3b):
    experts = _expert_parameters(QWEN3_30B_A3B)

    assert a3b.mapped_bytes == round(experts * Q4_K_BYTES)
    assert a3b.resident_bytes < 1.5e9  # attention, router and vocabulary: its own memory
    assert a3b.active_bytes == round(a3b.resident_bytes + a3b.mapped_bytes * 8 / 128)


def test_experts_converted_to_int4_are_resident(a3b_headers):
    converted = describe_headers(a3b_headers, "int4")
    experts = _expert_parameters(QWEN3_30B_A3B)

    assert converted.mapped_bytes == 0
    # the experts no token reads, in the int4 layout
    assert converted.weight_bytes - converted.active_bytes == pytest.approx(
        experts * INT4_BYTES_PER_ELEMENT * 120 / 128, abs=1)


def test_a_24_gib_machine_opens_a_30b_a3b_q4_k_m(a3b_headers, a3b):
    kv_cache = model_kv_cache_bytes(a3b_headers.shape, EngineConfig())

    check_fits_memory(a3b, kv_cache, available=20 * GIB, total=24 * GIB)


def test_experts_beyond_what_is_available_now_load_with_a_warning(a3b, caplog):
    with caplog.at_level(logging.WARNING, "pagoda.engine.loading.model_info"):
        check_fits_memory(a3b, AUTO_KV_CACHE_LIMIT, available=8 * GIB, total=24 * GIB)

    assert "read experts from the disk" in caplog.text


def test_a_machine_whose_ram_cannot_hold_the_experts_refuses_the_model(a3b):
    with pytest.raises(ModelLoadError, match=r"more than this machine's 16\.0 GiB.*from the "
                                             r"disk at every step"):
        check_fits_memory(a3b, AUTO_KV_CACHE_LIMIT, available=12 * GIB, total=16 * GIB)


def test_the_part_that_is_not_mapped_must_fit_in_what_is_available(a3b):
    with pytest.raises(ModelLoadError, match=r"experts 15\.2 GiB memory-mapped.*only 1\.0 GiB "
                                             "is available"):
        check_fits_memory(a3b, AUTO_KV_CACHE_LIMIT, available=GIB, total=24 * GIB)


def test_a_mixtral_shaped_llama_file_is_read_through_the_model_reader(tmp_path):
    path = write_moe_header_gguf(tmp_path / "mixtral.gguf", TINY_MIXTRAL)

    info = describe_headers(read_model_headers(path))

    experts = _expert_parameters(TINY_MIXTRAL)
    assert info.routing == ExpertRouting(8, 2)
    assert info.num_parameters == _total_parameters(TINY_MIXTRAL)
    assert info.num_active_parameters == info.num_parameters - experts + experts // 4


def test_experts_in_a_type_read_by_decoding_are_resident(tmp_path):
    path = write_moe_header_gguf(tmp_path / "q4_1.gguf", TINY_MIXTRAL, expert_type=QType.Q4_1)

    info = describe_headers(read_model_headers(path))

    assert info.mapped_bytes == 0 and info.routing is not None


def test_expert_tensors_without_an_expert_count_are_refused(tmp_path):
    path = write_moe_header_gguf(tmp_path / "keyless.gguf", TINY_MIXTRAL, routing_keys=False)

    with pytest.raises(ModelLoadError, match=r"ffn_gate_exps.*how many a token uses"):
        describe_headers(read_model_headers(path))


@pytest.mark.parametrize("config", [{"num_experts": 8, "num_experts_per_tok": 9},
                                    {"num_local_experts": 8, "num_experts_per_tok": 0},
                                    {"num_experts": 1 << 40, "num_experts_per_tok": 2},
                                    {"num_experts": "8", "num_experts_per_tok": 2}])
def test_routing_no_model_has_is_refused(config):
    with pytest.raises(ModelLoadError, match="experts"):
        routing_from_config(config, "config.json")


def test_a_stated_expert_count_without_top_k_is_refused():
    with pytest.raises(ModelLoadError, match="num_experts_per_tok"):
        routing_from_config({"num_local_experts": 8}, "config.json")


def test_a_dense_config_has_no_routing():
    assert routing_from_config({"hidden_size": 64, "intermediate_size": 128}, "c") is None


def test_qwen_moe_dense_layers_hold_no_experts():
    config = {"hidden_size": 8, "moe_intermediate_size": 4, "num_hidden_layers": 6,
              "decoder_sparse_step": 2, "mlp_only_layers": [1, 2]}

    # layers 1, 3, 5 are sparse by the step, and layer 1 is dense by the list
    assert expert_parameters(config, ExpertRouting(4, 2)) == 2 * 4 * 3 * 8 * 4


def test_shared_experts_and_routers_are_not_routed_experts():
    assert is_expert_tensor("blk.3.ffn_down_exps.weight")
    assert is_expert_tensor("model.layers.0.mlp.experts.5.up_proj.weight")
    assert is_expert_tensor("model.layers.0.block_sparse_moe.experts.1.w1.weight")
    assert not any(map(is_expert_tensor, ["blk.3.ffn_down_shexp.weight",
                                          "blk.3.ffn_gate_inp.weight",
                                          "model.layers.0.mlp.shared_expert.up_proj.weight",
                                          "model.layers.0.mlp.shared_experts.up_proj.weight",
                                          "model.layers.0.mlp.gate.weight"]))



# Qwen3-MoE as transformers 5 writes its config.json (the expert count as num_local_experts):
# every second layer sparse (1, 3, 5) but layer 3.
FOLDER_CONFIG = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128,
                 "moe_intermediate_size": 32, "num_hidden_layers": 6, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
                 "num_local_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2,
                 "mlp_only_layers": [3]}


def test_a_folders_experts_are_counted_from_config_json_and_its_tensors(tmp_path):
    experts = {f"model.layers.{i}.mlp.experts.{e}.{m}.weight": torch.zeros(shape)
               for i in (1, 5) for e in range(8)
               for m, shape in (("gate_proj", (32, 64)), ("up_proj", (32, 64)),
                                ("down_proj", (64, 32)))}
    others = {"model.embed_tokens.weight": torch.zeros(256, 64),
              "model.layers.1.mlp.gate.weight": torch.zeros(8, 64),
              "model.layers.1.mlp.shared_expert.up_proj.weight": torch.zeros(48, 64)}
    save_file(experts | others, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(FOLDER_CONFIG))

    info = describe_headers(read_model_headers(tmp_path))

    routed = 2 * 8 * 3 * 64 * 32
    assert info.routing == ExpertRouting(8, 2)
    assert routed == expert_parameters(FOLDER_CONFIG, info.routing)  # the Hub's count's view
    assert info.num_parameters == routed + 256 * 64 + 8 * 64 + 48 * 64
    assert info.num_active_parameters == info.num_parameters - routed * 6 // 8
    assert info.mapped_bytes == 0  # a folder's experts are converted, and resident
