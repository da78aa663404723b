"""EngineConfig.vision_dtype: the vision tower computes in its own dtype (bf16 where the CPU
multiplies it natively), its output joins the language model in the compute dtype, and a
chat's next tokens stay those of a float32 tower."""

import pytest
import torch

from pagoda.engine import LLM
from pagoda.engine.config import EngineConfig
from pagoda.engine.loading.loader import load_model
from pagoda.engine.models import vision_dtype as vision_dtype_module
from pagoda.engine.models.vision_dtype import vision_dtype
from pagoda.engine.multimodal.image_processing import image_processor
from pagoda.engine.multimodal.placeholders import image_spans
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.multimodal.test_gemma3_images import photo, prompt
from tests.engine.tiny_vision import save_gemma3_as_released, tiny_gemma3_vision

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# The tiny tower's output in bf16 against fp32, as a relative norm: measured 0.4% (the
# SigLIP-400M-shaped tower of 27 layers: 0.68%); bf16 keeps 8 bits of each value.
BF16_TOWER_ERROR = 0.02
# The tiny model's random logits are nearly flat (median top-2 gap 0.027): a top-2 gap under
# this is within a bf16 tower's reach, which moved no logit by more than 0.0053. 40 of the
# prompt's 55 positions have a wider gap, each of which bf16 must predict as fp32 does.
BF16_NEAR_TIE = 0.01


@pytest.fixture(scope="module")
def gemma3():
    return tiny_gemma3_vision()


@pytest.fixture(scope="module")
def folder(gemma3, tmp_path_factory):
    return save_gemma3_as_released(gemma3, tmp_path_factory.mktemp("gemma3_vision"))


def runner_with_tower_in(folder, setting: str) -> ModelRunner:
    return ModelRunner(load_model(folder, quantization="none"),
                       EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                    vision_dtype=setting))


def test_an_unknown_vision_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="vision_dtype='int8' must be one of auto, float32, "
                                         "bfloat16, float16"):
        EngineConfig(vision_dtype="int8")


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_computes_in_bf16_only_on_a_cpu_that_multiplies_it_natively(monkeypatch, native,
                                                                         expected):
    monkeypatch.setattr(vision_dtype_module, "cpu_multiplies_bf16", lambda: native)
    assert vision_dtype("auto", CPU, torch.float32) == expected


def test_auto_on_cuda_is_the_16_bit_compute_dtype_or_bf16():
    assert vision_dtype("auto", CUDA, torch.float16) == torch.float16
    assert vision_dtype("auto", CUDA, torch.bfloat16) == torch.bfloat16
    assert vision_dtype("auto", CUDA, torch.float32) == torch.bfloat16


def test_a_named_vision_dtype_is_kept_whatever_the_cpu():
    assert vision_dtype("float32", CPU, torch.float32) == torch.float32
    assert vision_dtype("bfloat16", CPU, torch.float32) == torch.bfloat16


def test_the_tower_is_built_in_the_vision_dtype_and_the_language_model_in_its_own(folder):
    runner = runner_with_tower_in(folder, "bfloat16")
    tower = runner.image_tower
    assert tower.encoder.positions.dtype == torch.bfloat16
    assert tower.encoder.layers[0].fc1.method.weight.dtype == torch.bfloat16
    assert runner.model.layers[0].qkv_proj.method.weight.dtype == torch.float32


def test_a_disk_cache_written_by_a_tower_of_another_dtype_is_not_read(folder, tmp_path):
    """An image's blocks hold what the tower computed: each vision dtype keeps its own."""
    for setting in ("float32", "bfloat16", "float32"):
        LLM(str(folder), num_threads=1, num_kv_blocks=64, disk_cache_dir=tmp_path,
            vision_dtype=setting).engine.close()
    assert len([d for d in tmp_path.iterdir() if d.is_dir()]) == 2  # one folder per fingerprint


def test_a_bf16_towers_output_is_within_bf16s_rounding_of_fp32s(folder):
    pixels = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        fp32 = runner_with_tower_in(folder, "float32").image_tower(pixels)
        bf16 = runner_with_tower_in(folder, "bfloat16").image_tower(pixels)
    assert bf16.dtype == torch.bfloat16
    error = (bf16.float() - fp32).norm() / fp32.norm()
    assert error < BF16_TOWER_ERROR


def test_a_bf16_tower_predicts_the_chats_next_tokens_as_fp32s_does_but_at_near_ties(gemma3,
                                                                                    folder):
    """Teacher-forced over a prompt of text and two images: each position's next token."""
    ids = prompt(gemma3, images=2)
    logits = []
    for setting in ("float32", "bfloat16"):
        runner = runner_with_tower_in(folder, setting)
        tower = runner.image_tower
        spans = image_spans(ids, [photo(0), photo(1)], tower.image_token_id,
                            image_processor(tower))
        logits.append(prompt_logits(runner, ids, images=spans))
    fp32, bf16 = logits
    assert bf16.dtype == torch.float32
    top2 = fp32.topk(2, dim=-1).values
    decided = top2[:, 0] - top2[:, 1] >= BF16_NEAR_TIE
    assert decided.sum() >= 2 * len(ids) // 3
    assert torch.equal(fp32.argmax(-1)[decided], bf16.argmax(-1)[decided])
