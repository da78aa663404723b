"""gpt-oss runs as transformers defines it, from a model folder, and as llama.cpp runs the GGUF
files its converter and llama-quantize write of it.

The tiny model (tests/engine/tiny_models.py, "gpt-oss") windows layers 0 and 2 to 8 keys and
keeps 1 and 3 full, so every test prompt runs past the window; 8 experts, top 2, with biases
and the clamped SwiGLU; sinks; the released YaRN. The reference is transformers' eager
attention, the one that applies the sinks.

llama.cpp rounds YaRN's correction range to whole dimensions (transformers' gpt-oss does not):
on this model that moves logits by up to 1.3, so a GGUF file's config says truncate, and the
file is compared against the folder under the same setting.
"""

import dataclasses
import shutil

import gguf
import numpy as np
import pytest
import torch
import transformers

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.gpt_oss import architecture, config_from_gguf
from tests.engine.family_parity import (
    FakeGGUFSettings,
    assert_same_argmax,
    eager_hf_model,
    engine_logits,
    greedy_disagreements_with_llama_cpp,
    hf_logits,
)
from tests.engine.llama_cpp_converter import (
    convert_tiny_variants,
    mxfp4_experts_file,
    quantize_with_llama_cpp,
)
from tests.engine.llama_cpp_references import llama_cpp_records
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts

WINDOW = 8  # the tiny model's sliding_window
RECORDS = "tiny_gpt_oss.json"

pytestmark = pytest.mark.usefixtures("fresh_gguf_metadata_cache")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple:
    """The tiny folder and the f16 GGUF llama.cpp's converter writes of it."""
    return convert_tiny_variants(tmp_path_factory.mktemp("gpt-oss"), ("gpt-oss",))["gpt-oss"]


@pytest.fixture(scope="module")
def folder(files):
    return files[0]


@pytest.fixture(scope="module")
def hf_model(folder):
    return eager_hf_model(folder)


@pytest.fixture(scope="module")
def prompts(folder) -> list[list[int]]:
    """Chats and raw text, each past the window."""
    ids = parity_prompts(transformers.AutoTokenizer.from_pretrained(folder))
    assert all(len(p) > WINDOW for p in ids)
    return ids


@pytest.fixture(scope="module")
def reference(hf_model, prompts) -> list[torch.Tensor]:
    """transformers' logits on every other prompt (a chat and a raw text in each language)."""
    return hf_logits(hf_model, prompts[::2])


def test_gpt_oss_folder_predicts_transformers_next_token_at_every_position(
        folder, reference, prompts):
    for i, (ours, theirs) in enumerate(zip(engine_logits(folder, prompts[::2]), reference,
                                           strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_the_tiny_gpt_oss_sinks_change_its_predictions(hf_model, reference, prompts):
    """Without sinks transformers predicts other tokens: the parity above proves the sinks."""
    sinks = [layer.self_attn.sinks for layer in hf_model.model.layers]
    kept = [s.detach().clone() for s in sinks]
    with torch.no_grad():
        for s in sinks:
            s.fill_(float("-inf"))  # a sink of weight exp(-inf) = 0: plain softmax
        try:
            free = hf_logits(hf_model, prompts[::2])
        finally:
            for s, value in zip(sinks, kept, strict=True):
                s.copy_(value)
    changed = sum(int((a.argmax(-1) != b.argmax(-1)).sum())
                  for a, b in zip(reference, free, strict=True))
    assert changed > 0


def test_gpt_oss_greedy_through_chunked_prefill_and_decoding_past_the_window_matches_transformers(
        folder, hf_model, prompts):
    """Decode steps attend through the C decode kernel with its sinks."""
    llm = LLM(str(folder), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=16)
    assert_greedy_parity(llm, hf_model, prompts)


def test_gpt_oss_architecture_reads_windows_sinks_biases_and_its_experts(folder):
    arch = architecture(transformers.AutoConfig.from_pretrained(folder))
    assert arch.shape.layer_windows == (WINDOW, 0, WINDOW, 0)
    assert arch.names.sinks == "self_attn.sinks" and arch.qkv_bias and arch.o_bias
    moe = arch.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (8, 2, 32)
    assert moe.sparse_layers == {0, 1, 2, 3}
    assert moe.softmax_after_top_k and moe.router_bias and moe.expert_bias
    assert (moe.activation, moe.swiglu_limit, moe.swiglu_alpha) == ("swiglu_oai", 7.0, 1.702)
    assert dict(arch.ropes["default"].parameters)["rope_type"] == "yarn"


@pytest.mark.parametrize(("settings", "words"), [
    ({"num_local_experts": 10 ** 7}, "more than Pagoda reads"),
    ({"num_experts_per_tok": 9}, "routes each token to 9"),
])
def test_a_config_of_impossible_experts_is_refused_in_words(folder, settings, words):
    config = transformers.AutoConfig.from_pretrained(folder)
    for key, value in settings.items():
        setattr(config, key, value)
    with pytest.raises(ModelLoadError, match=words):
        architecture(config)


def test_a_folder_whose_fused_experts_disagree_with_its_config_is_refused(folder, tmp_path):
    """The experts' tensors are sliced per expert at load: a wrong width is refused first."""
    copy = shutil.copytree(folder, tmp_path / "narrower")
    config = (copy / "config.json").read_text().replace('"intermediate_size": 32',
                                                        '"intermediate_size": 16')
    (copy / "config.json").write_text(config)
    with pytest.raises(ModelLoadError, match=r"mlp\.experts\..*config\.json implies"):
        LLM(str(copy), num_kv_blocks=16)


# The files llama.cpp's converter and llama-quantize write


def truncated_yarn_model(folder):
    """transformers' gpt-oss with YaRN's correction range truncated, as llama.cpp runs it."""
    rope = dict(transformers.AutoConfig.from_pretrained(folder).rope_parameters, truncate=True)
    return eager_hf_model(folder, rope_parameters=rope)


@torch.no_grad()
def _set_weights_from_gguf(model, gguf_file) -> None:
    """The model's matrices as gguf-py dequantizes the file's (biases, norms, sinks and routers
    are float32 in the file, as in the folder)."""
    tensors = {t.name: torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type)))
               for t in gguf.GGUFReader(gguf_file).tensors if t.name.endswith("weight")
               and t.tensor_type != gguf.GGMLQuantizationType.F32}
    model.model.embed_tokens.weight.copy_(tensors["token_embd.weight"])
    model.lm_head.weight.copy_(tensors["output.weight"])
    for i, layer in enumerate(model.model.layers):
        for module, name in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                             ("o_proj", "attn_output")):
            getattr(layer.self_attn, module).weight.copy_(tensors[f"blk.{i}.{name}.weight"])
        experts = layer.mlp.experts
        gate, up, down = (tensors[f"blk.{i}.ffn_{kind}_exps.weight"]
                          for kind in ("gate", "up", "down"))
        experts.gate_up_proj[:, :, 0::2] = gate.transpose(1, 2)  # transformers interleaves them
        experts.gate_up_proj[:, :, 1::2] = up.transpose(1, 2)
        experts.down_proj.copy_(down.transpose(1, 2))


@torch.no_grad()
def _round_matrices_to_fp16(model) -> None:
    """The model as the converter's f16 file holds it: matrices f16, biases and routers f32."""
    for name, parameter in model.named_parameters():
        if parameter.ndim >= 2 and "router" not in name and not name.endswith("_bias"):
            parameter.copy_(parameter.half().float())


def _assert_file_predicts_transformers_on_its_weights(gguf_file, folder, prompts,
                                                      set_weights=_set_weights_from_gguf) -> None:
    reference = truncated_yarn_model(folder)
    set_weights(reference, gguf_file)
    some = prompts[::4]  # a chat and a raw text
    for i, (ours, theirs) in enumerate(zip(engine_logits(gguf_file, some),
                                           hf_logits(reference, some), strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_gpt_oss_gguf_gives_transformers_logits_on_the_files_weights(files, prompts):
    folder, gguf_file = files
    _assert_file_predicts_transformers_on_its_weights(
        gguf_file, folder, prompts, lambda model, _: _round_matrices_to_fp16(model))


def test_gpt_oss_gguf_config_runs_the_folders_architecture_with_llama_cpps_yarn(files):
    folder, gguf_file = files
    want = architecture(transformers.AutoConfig.from_pretrained(folder))
    got = architecture(config_from_gguf(GGUFModelFile(gguf_file)))
    rope = dict(want.ropes["default"].parameters) | {"truncate": True}
    assert dict(got.ropes["default"].parameters) == rope
    assert got.shape.rms_norm_eps == pytest.approx(want.shape.rms_norm_eps, rel=1e-7)
    assert dataclasses.replace(got, shape=want.shape, ropes=want.ropes) == want


def test_gpt_oss_gguf_greedy_tokens_equal_llama_cpps(files):
    record, = llama_cpp_records(RECORDS, family="gpt-oss", type="f16")
    assert not greedy_disagreements_with_llama_cpp(files[1], record)


@pytest.fixture(scope="module")
def mxfp4_file(files, tmp_path_factory):
    return mxfp4_experts_file(files[1], tmp_path_factory.mktemp("mxfp4") /
                              "tiny-gpt-oss.MXFP4-experts.gguf")


def test_gpt_oss_mxfp4_experts_give_transformers_logits_on_gguf_pys_values(
        mxfp4_file, folder, prompts):
    """Our MXFP4 decoding is gguf-py's: the model on it gives transformers' logits."""
    _assert_file_predicts_transformers_on_its_weights(mxfp4_file, folder, prompts)


def test_gpt_oss_mxfp4_moe_file_gives_transformers_logits_on_gguf_pys_values(
        files, prompts, tmp_path):
    """llama-quantize's MXFP4_MOE as released files hold it: MXFP4 experts, Q8_0 elsewhere."""
    path = quantize_with_llama_cpp(files[1], tmp_path / "tiny-gpt-oss.MXFP4_MOE.gguf",
                                   "MXFP4_MOE")
    _assert_file_predicts_transformers_on_its_weights(path, files[0], prompts)


def test_gpt_oss_mxfp4_experts_greedy_tokens_equal_llama_cpps(mxfp4_file):
    record, = llama_cpp_records(RECORDS, family="gpt-oss", type="MXFP4 experts")
    assert not greedy_disagreements_with_llama_cpp(mxfp4_file, record, near_tie=0.2)


# A gpt-oss file's settings as llama.cpp reads them


_GPT_OSS_KEYS = {"gpt-oss.embedding_length": 64, "gpt-oss.attention.head_count": 4,
                 "gpt-oss.attention.head_count_kv": 2, "gpt-oss.block_count": 4,
                 "gpt-oss.feed_forward_length": 32, "gpt-oss.expert_feed_forward_length": 32,
                 "gpt-oss.expert_count": 8, "gpt-oss.expert_used_count": 2,
                 "gpt-oss.context_length": 4096, "gpt-oss.attention.sliding_window": 128,
                 "gpt-oss.rope.freq_base": 150000.0}


def test_a_gpt_oss_file_windows_every_other_layer_from_the_first():
    arch = architecture(config_from_gguf(FakeGGUFSettings("gpt-oss", _GPT_OSS_KEYS, {})))
    assert arch.shape.layer_windows == (128, 0, 128, 0)


def test_a_gpt_oss_file_with_a_window_pattern_is_refused_in_words():
    keys = _GPT_OSS_KEYS | {"gpt-oss.attention.sliding_window_pattern": 3}
    with pytest.raises(ModelLoadError, match="sliding_window_pattern"):
        config_from_gguf(FakeGGUFSettings("gpt-oss", keys, {}))


@pytest.mark.slow  # Triton's interpreter runs its kernels on the CPU: ~10 s on a quiet machine
def test_gpt_oss_on_the_triton_kernels_gives_the_torch_paths_greedy_tokens(folder, prompts):
    """The attention kernels with sinks, prefill and decode, in windowed and full layers; the
    biased experts' clamped SwiGLU in the fused experts kernel."""
    from pagoda.engine.quantization.triton_experts import TritonExpertsMethod  # imports triton

    def greedy(backend: str) -> list[int]:
        llm = LLM(str(folder), num_kv_blocks=32, num_threads=1, kernel_backend=backend)
        model = llm.engine.runner.model
        assert model.ops.name == backend
        fused = {isinstance(layer.mlp.experts, TritonExpertsMethod) for layer in model.layers}
        assert fused == {backend == "triton"}
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        return llm.generate([min(prompts, key=len)], params)[0].outputs[0].token_ids

    assert greedy("triton") == greedy("torch")
