"""Qwen3-MoE and Qwen2-MoE run as transformers defines them, from model folders.

The tiny models (tests/engine/tiny_models.py): "qwen3moe" routes each token to 4 of 16 experts,
renormalised, in every layer; "qwen3moe-dense-layers" to 2 of 8, not renormalised, in layers 1
and 5 only (decoder_sparse_step 2, layer 3 in mlp_only_layers), the others dense; "qwen2moe"
adds Qwen2's q/k/v biases and a shared expert behind a sigmoid gate.
"""

import json

import pytest
import torch
import transformers
from tiny_models import save_tiny_model

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.loader import load_model
from pagoda.engine.models.qwen3_moe import architecture
from tests.engine.family_parity import assert_same_argmax, engine_logits, hf_logits
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts

VARIANTS = ("qwen3moe", "qwen3moe-dense-layers", "qwen2moe")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("qwen-moe")
    return {variant: save_tiny_model(root / variant, variant) for variant in VARIANTS}


@pytest.fixture(scope="module")
def prompts(folders) -> list[list[int]]:
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(folders["qwen3moe"]))


def hf_model(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_qwen_moe_folder_predicts_transformers_next_token_at_every_position(
        folders, prompts, variant):
    some = [prompts[0], prompts[6]]  # a chat in English, a raw text in code (all 8: greedy)
    theirs = hf_logits(hf_model(folders[variant]), some)
    for i, (ours, reference) in enumerate(zip(engine_logits(folders[variant], some), theirs,
                                              strict=True)):
        assert_same_argmax(ours, reference, f"prompt {i}")
        torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


def test_qwen3_moe_greedy_through_a_batch_and_chunked_prefill_matches_transformers(
        folders, prompts):
    folder = folders["qwen3moe-dense-layers"]
    llm = LLM(str(folder), num_kv_blocks=128, num_threads=NUM_THREADS,
              max_num_batched_tokens=32)
    assert_greedy_parity(llm, hf_model(folder), prompts)


def test_a_batch_of_prompts_gives_each_the_tokens_it_gets_alone(folders, prompts):
    """Prompts that share a step share experts (and route to others each): none changes
    another's reply."""
    llm = LLM(str(folders["qwen3moe"]), num_kv_blocks=128, num_threads=NUM_THREADS)
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    together = [out.outputs[0].token_ids for out in llm.generate(prompts, greedy)]
    alone = [llm.generate([p], greedy)[0].outputs[0].token_ids for p in prompts]
    assert together == alone


def test_the_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers(folders):
    config = transformers.AutoConfig.from_pretrained(folders["qwen3moe-dense-layers"])
    arch = architecture(config)
    assert arch.moe.sparse_layers == {1, 5}
    assert (arch.moe.num_experts, arch.moe.top_k, arch.moe.renormalize) == (8, 2, False)
    # transformers builds the same layers sparse.
    model = hf_model(folders["qwen3moe-dense-layers"])
    assert {i for i, layer in enumerate(model.model.layers)
            if hasattr(layer.mlp, "experts")} == arch.moe.sparse_layers


def test_qwen2_moe_has_a_gated_shared_expert_and_qkv_biases(folders):
    arch = architecture(transformers.AutoConfig.from_pretrained(folders["qwen2moe"]))
    assert (arch.moe.shared_expert_size, arch.moe.shared_expert_gate) == (48, True)
    assert (arch.qkv_bias, arch.o_bias, arch.names.q_norm) == (True, False, None)


def test_a_folder_in_transformers_fused_expert_layout_gives_the_same_logits(
        folders, prompts, tmp_path):
    """save_pretrained(save_original_format=False) keeps a layer's experts as two 3-D tensors."""
    model = hf_model(folders["qwen2moe"])
    model.save_pretrained(tmp_path, save_original_format=False)
    transformers.AutoTokenizer.from_pretrained(folders["qwen2moe"]).save_pretrained(tmp_path)
    index = json.dumps(sorted(_tensor_names(tmp_path)))
    assert "mlp.experts.gate_up_proj" in index and "mlp.experts.0." not in index
    for fused, per_expert in zip(engine_logits(tmp_path, prompts[:2]),
                                 engine_logits(folders["qwen2moe"], prompts[:2]), strict=True):
        # The same weights, at other addresses: a matmul's vector loads may round apart.
        torch.testing.assert_close(fused, per_expert, atol=1e-5, rtol=1e-5)


def test_int4_quantization_keeps_the_routers_float(folders):
    weights = load_model(folders["qwen2moe"], quantization="int4").weights
    assert isinstance(weights["model.layers.0.mlp.gate.weight"], torch.Tensor)
    assert isinstance(weights["model.layers.0.mlp.shared_expert_gate.weight"], torch.Tensor)
    assert not isinstance(weights["model.layers.0.mlp.experts.0.up_proj.weight"], torch.Tensor)


@pytest.mark.parametrize(("settings", "words"), [
    ({"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ({"mlp_only_layers": [7]}, "mlp_only_layers"),
    ({"num_experts_per_tok": 9}, "9 \\(num_experts_per_tok\\) of 8"),
    ({"num_experts": 2048}, "2048 experts \\(num_experts\\) in each of 4 layers"),
    ({"num_experts": 1000, "num_hidden_layers": 100}, "65536 in all"),
])
def test_a_qwen_moe_config_naming_no_such_layers_or_too_many_experts_is_refused(settings, words):
    config = transformers.Qwen3MoeConfig(**({"num_hidden_layers": 4, "num_experts": 8} | settings))
    with pytest.raises(ModelLoadError, match=words):
        architecture(config)


def _tensor_names(folder) -> list[str]:
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", framework="pt") as tensors:
        return list(tensors.keys())


@pytest.mark.slow  # Triton's interpreter runs its kernels on the CPU: ~15 s on a quiet machine
def test_qwen_moe_on_the_triton_kernels_gives_the_torch_paths_greedy_tokens(folders, prompts):
    """The routed experts through the fused Triton kernel (the GPU's path), the shared
    expert through the Triton linears."""
    from pagoda.engine.quantization.triton_experts import TritonExpertsMethod  # imports triton

    def greedy(backend: str) -> list[list[int]]:
        llm = LLM(str(folders["qwen2moe"]), num_kv_blocks=64, num_threads=1,
                  kernel_backend=backend, max_num_batched_tokens=16)
        model = llm.engine.runner.model
        assert model.ops.name == backend
        fused = {isinstance(layer.mlp.experts, TritonExpertsMethod) for layer in model.layers}
        assert fused == {backend == "triton"}
        replies = llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=6,
                                                           ignore_eos=True))
        return [reply.outputs[0].token_ids for reply in replies]

    assert greedy("triton") == greedy("torch")
