"""Mixture-of-experts GGUF files (pagoda/engine/loading/gguf.py, pagoda/engine/models/moe_gguf.py): their
settings read as llama.cpp reads them, what Pagoda does not run refused in words; the tiny
Qwen3-MoE and Mixtral (tests/engine/tiny_models.py) as llama.cpp's converter writes them give
their folders' logits and llama.cpp's greedy tokens; a 30B-A3B-shaped file's experts stay in
its memory map."""

import dataclasses
import struct
from pathlib import Path

import pytest
import torch
import transformers

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.moe_gguf import (
    MAX_EXPERT_MATRICES,
    MAX_EXPERTS,
    mixtral_config,
    qwen2moe_config,
    qwen3moe_config,
)
from pagoda.engine.models.registry import architecture_of, expected_weight_shapes, family_for_gguf
from pagoda.engine.quantization.tensors import GGUFRows
from tests.engine.family_parity import (
    LLAMA_CPP_QUANTIZED_NEAR_TIE,
    FakeGGUFSettings,
    engine_logits,
    greedy_disagreements_with_llama_cpp,
    hf_logits,
)
from tests.engine.llama_cpp_converter import (
    LLAMA_CPP_MOE_VARIANTS,
    quantize_with_llama_cpp,
)
from tests.engine.llama_cpp_references import llama_cpp_records, sha256
from tests.engine.models.test_parity import parity_prompts
from tests.engine.moe_header_gguf import QWEN3_30B_A3B, write_moe_header_gguf

pytestmark = pytest.mark.usefixtures("fresh_gguf_metadata_cache")

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


# The files llama.cpp's converter writes of the tiny Qwen3-MoE and Mixtral (`moe_ggufs`,
# tests/conftest.py)


@pytest.fixture(scope="module")
def prompts(moe_ggufs) -> list[list[int]]:
    folder = moe_ggufs[LLAMA_CPP_MOE_VARIANTS[0]][0]
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(folder))


@torch.no_grad()
def _as_the_file_holds_it(model):
    """The folder's model with each matrix rounded as llama.cpp's f16 file holds it: every
    matrix and 3-D expert tensor in fp16 but the routers, which the converter keeps in fp32
    (as it does norms)."""
    for name, parameter in model.named_parameters():
        if parameter.ndim >= 2 and not name.endswith(_KEPT_FLOAT32):
            parameter.copy_(parameter.half().float())
    return model


_KEPT_FLOAT32 = ("mlp.gate.weight", "shared_expert_gate.weight")


@pytest.mark.parametrize("variant", LLAMA_CPP_MOE_VARIANTS)
def test_a_moe_gguf_gives_the_folders_logits_to_fp16_rounding(moe_ggufs, prompts, variant):
    """Every expert read from its slice of the file's 3-D tensors, and the router from
    ffn_gate_inp: an expert taken from another's rows, or the top k weighted otherwise than
    the folder's config, moves these logits by far more than fp16 rounding."""
    folder, gguf_file = moe_ggufs[variant]
    reference = _as_the_file_holds_it(
        transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())
    for ours, theirs in zip(engine_logits(gguf_file, prompts), hf_logits(reference, prompts),
                            strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", LLAMA_CPP_MOE_VARIANTS)
def test_a_moe_gguf_config_runs_the_folders_architecture(moe_ggufs, variant):
    folder, gguf_file = moe_ggufs[variant]
    want = architecture_of(transformers.AutoConfig.from_pretrained(folder))
    file = GGUFModelFile(gguf_file)
    got = architecture_of(family_for_gguf(file.architecture).config_from_gguf(file))
    # The file keeps rms_norm_eps as float32; fp32 math rounds the folder's to that same value.
    assert got.shape.rms_norm_eps == pytest.approx(want.shape.rms_norm_eps, rel=1e-7)
    assert dataclasses.replace(got, shape=want.shape) == want


@pytest.mark.parametrize("variant", LLAMA_CPP_MOE_VARIANTS)
def test_a_moe_gguf_greedy_tokens_equal_llama_cpps(moe_ggufs, variant):
    record, = llama_cpp_records("tiny_moe.json", family=variant, type="f16")
    assert not greedy_disagreements_with_llama_cpp(moe_ggufs[variant][1], record)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("variant", LLAMA_CPP_MOE_VARIANTS)
def test_a_llama_quantized_moe_gguf_greedy_tokens_equal_llama_cpps_but_at_rounding_ties(
        moe_ggufs, tmp_path, variant, kind):
    """llama-quantize's files (rows 64 wide: its Q4_K_M holds Q5_0 experts, decoded at load, its
    Q8_0 Q8_0 experts, read in place), where a build is at hand (skipped elsewhere); compared,
    as the dense families' are, up to llama.cpp's first near-tie.

    llama.cpp rounds every activation to 8 bits before a quantized matrix, and a router whose
    k-th and next expert score nearly alike (0.055 apart in the tiny Mixtral's first layer on
    prompt 0) then hands the token other experts: its tokens can leave the exact ones further
    than a dense model's ~0.2. So where our reply leaves llama.cpp's before that, its token
    must be a near-tie of the exact logits there (the file's weights dequantized, fp32): within
    LLAMA_CPP_QUANTIZED_NEAR_TIE of the best (qwen3moe's Q8_0: one token 0.10 behind)."""
    quantized = quantize_with_llama_cpp(moe_ggufs[variant][1], tmp_path / f"{variant}.{kind}.gguf",
                                        kind)
    record, = llama_cpp_records("tiny_moe.json", family=variant, type=kind)
    assert sha256(quantized) == record.sha256
    llm = LLM(str(quantized), num_kv_blocks=64, num_threads=1)
    params = SamplingParams(temperature=0, max_tokens=len(record.continuations[0].llama_cpp_tokens),
                            ignore_eos=True)
    replies = llm.generate([c.prompt_ids for c in record.continuations], params)
    left = {}  # prompt -> the first token where llama.cpp's reply leaves ours
    for i, (c, reply) in enumerate(zip(record.continuations, replies, strict=True)):
        ties = [j for j, gap in enumerate(c.top2_logprob_gaps) if gap <= LLAMA_CPP_QUANTIZED_NEAR_TIE]
        compared = ties[0] if ties else len(c.llama_cpp_tokens)
        ours = list(reply.outputs[0].token_ids)
        differ = [j for j in range(compared) if ours[j] != c.llama_cpp_tokens[j]]
        if differ:
            left[i] = differ[0]
    exact = engine_logits(quantized, [record.continuations[i].prompt_ids
                                      + record.continuations[i].llama_cpp_tokens[:j]
                                      for i, j in left.items()])
    for (i, j), logits in zip(left.items(), exact, strict=True):
        theirs = record.continuations[i].llama_cpp_tokens[j]
        behind = float(logits[-1].max() - logits[-1, theirs])
        assert behind <= LLAMA_CPP_QUANTIZED_NEAR_TIE, (
            f"prompt {i}, token {j}: llama.cpp's {theirs} is {behind:.3f} behind the best")


# Damaged files, refused in words before a weight is decoded


def _with_tensor_header(source: Path, out: Path, name: str, new_name: str | None = None,
                        dims: tuple[int, ...] | None = None) -> Path:
    """A copy of source whose header renames tensor `name` (to one as long) or gives it other
    dimensions (innermost first, as many as it has)."""
    data = bytearray(source.read_bytes())
    key = name.encode()
    at = data.index(struct.pack("<Q", len(key)) + key) + 8
    if new_name is not None:
        assert len(new_name) == len(name)
        data[at:at + len(key)] = new_name.encode()
    if dims is not None:
        n_dims = struct.unpack_from("<I", data, at + len(key))[0]
        assert n_dims == len(dims)
        struct.pack_into(f"<{n_dims}Q", data, at + len(key) + 4, *dims)
    out.write_bytes(data)
    return out


def _load_weights(gguf_file: Path) -> None:
    file = GGUFModelFile(gguf_file)
    config = qwen3moe_config(file)
    file.weights(expected_weight_shapes(config), config)


@pytest.mark.parametrize(("tensor", "dims", "words"), [
    # 4 experts' rows where the file states 16 (the rest of its bytes then belong to nothing)
    ("blk.1.ffn_up_exps.weight", (64, 32, 4), r"shape \(4, 32, 64\).*implies \(16, 32, 64\)"),
    # each expert's down matrix half as tall
    ("blk.0.ffn_down_exps.weight", (32, 32, 16),
     r"shape \(16, 32, 32\).*implies \(16, 64, 32\)"),
])
def test_a_3d_expert_tensor_of_another_shape_than_the_files_settings_is_refused(
        moe_ggufs, tmp_path, tensor, dims, words):
    damaged = _with_tensor_header(moe_ggufs["qwen3moe"][1], tmp_path / "damaged.gguf", tensor,
                                  dims=dims)
    with pytest.raises(ModelLoadError, match=f"{tensor}.*{words}"):
        _load_weights(damaged)


def test_a_file_missing_a_layers_router_is_refused_from_its_header(moe_ggufs, tmp_path):
    damaged = _with_tensor_header(moe_ggufs["qwen3moe"][1], tmp_path / "damaged.gguf",
                                  "blk.1.ffn_gate_inp.weight", new_name="blk.1.ffn_gate_inX.weight")
    with pytest.raises(ModelLoadError, match=r"no tensor blk\.1\.ffn_gate_inp\.weight "
                                             r"\(model\.layers\.1\.mlp\.gate\.weight\)"):
        GGUFModelFile(damaged)


def test_a_mixtral_file_missing_its_experts_is_refused_from_its_header(moe_ggufs, tmp_path):
    """A llama file that states experts needs them where a dense one needs ffn_gate/up/down."""
    damaged = _with_tensor_header(moe_ggufs["mixtral"][1], tmp_path / "damaged.gguf",
                                  "blk.0.ffn_gate_exps.weight", new_name="blk.0.ffn_gate_expX.weight")
    with pytest.raises(ModelLoadError, match=r"no tensor blk\.0\.ffn_gate_exps\.weight"):
        GGUFModelFile(damaged)


# The experts of a 30B-A3B-shaped file stay in its memory map


def test_every_expert_of_a_30b_a3b_shaped_q4_k_file_is_a_view_of_the_files_rows(tmp_path):
    """The 17 GB file (a sparse file: its header real, its data a hole) opens on a 24 GB
    machine only if no expert is copied: each expert's weight is its own rows of the file's
    memory-mapped 3-D tensor, in place."""
    path = write_moe_header_gguf(tmp_path / "a3b.gguf", QWEN3_30B_A3B)
    file = GGUFModelFile(path)
    config = qwen3moe_config(file)
    weights = file.weights(expected_weight_shapes(config), config)
    checked = 0
    for layer in range(QWEN3_30B_A3B.layers):
        for module, tensor in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                               ("down_proj", "ffn_down_exps")):
            rows = file.tensors[f"blk.{layer}.{tensor}.weight"].data
            for expert in range(QWEN3_30B_A3B.experts):
                weight = weights[f"model.layers.{layer}.mlp.experts.{expert}.{module}.weight"]
                assert isinstance(weight, GGUFRows) and weight.type_name == "Q4_K"
                assert weight.blocks.data_ptr() == rows[expert].ctypes.data
                assert weight.blocks.shape == rows[expert].shape
                checked += 1
    assert checked == 48 * 128 * 3
