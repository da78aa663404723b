"""A Qwen2.5-VL as users download it for images: the language model's qwen2vl GGUF and its
mmproj, both written by llama.cpp's converter from one multimodal folder. With two images of
different sizes, the pair gives transformers' next token at every position (its logits at the
files' fp16 rounding)."""

import pytest
import torch
import transformers

from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.loader import load_model
from pagoda.engine.loading.mmproj import MMProjFile
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.family_parity import assert_same_argmax
from tests.engine.llama_cpp_converter import convert_mmproj, convert_to_gguf
from tests.engine.multimodal.test_qwen2_5_vl_images import hf_logits, photos, prompt, spans_of
from tests.engine.tiny_gguf import write_tiny_gguf
from tests.engine.tiny_vision import save_qwen2_5_vl, tiny_qwen2_5_vl


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen2_5_vl()


@pytest.fixture(scope="module")
def files(qwen, tmp_path_factory):
    folder = save_qwen2_5_vl(qwen, tmp_path_factory.mktemp("qwen2_5_vl"))
    return (folder, convert_to_gguf(folder, folder / "tiny-qwen2.5-vl.f16.gguf"),
            convert_mmproj(folder, folder / "mmproj-tiny-qwen2.5-vl.f16.gguf"))


@torch.no_grad()
def as_the_files_hold_it(model):
    """Its matrices and the patch kernel at fp16 (the files' f16), its norms and biases
    float32."""
    for parameter in model.parameters():
        if parameter.ndim >= 2:
            parameter.copy_(parameter.half().float())
    return model


def test_the_mmproj_states_the_folders_tower(qwen, files):
    _, model_file, mmproj = files
    text = load_model(model_file, quantization="none").config
    config = MMProjFile(mmproj).qwen2_5_vl_config(text)
    theirs = qwen.config.vision_config
    assert list(config.vision_config.fullatt_block_indexes) == list(theirs.fullatt_block_indexes)
    assert config.vision_config.window_size == theirs.window_size
    assert text.rope_parameters["mrope_section"] == [2, 3, 3]


def test_a_gguf_and_its_mmproj_give_transformers_next_tokens_with_images(qwen, files):
    folder, model_file, mmproj = files
    runner = ModelRunner(load_model(model_file, quantization="none", mmproj=mmproj),
                         EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                      vision_dtype="float32"))
    images = photos(2)
    ids = prompt(qwen, images)
    spans = spans_of(runner, ids, images)
    ours = prompt_logits(runner, ids, chunk=13, images=spans)
    reference = as_the_files_hold_it(
        transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
            folder, attn_implementation="eager", dtype=torch.float32).eval())
    theirs = hf_logits(reference, ids, spans)
    assert_same_argmax(ours, theirs, "two images")
    torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=1e-3)


def test_a_qwen_mmproj_beside_another_family_is_refused(files, tmp_path):
    _, _, mmproj = files
    llama = write_tiny_gguf(tmp_path / "llama.gguf").path
    with pytest.raises(ModelLoadError, match="Qwen2.5-VL vision tower, and llama.gguf is a llama"):
        load_model(llama, mmproj=mmproj)


def test_an_mmproj_that_normalises_otherwise_is_refused(files):
    _, model_file, mmproj = files
    file = MMProjFile(mmproj)
    stated = file._field
    file._field = lambda key: [0.5] * 3 if key == "clip.vision.image_mean" else stated(key)
    with pytest.raises(ModelLoadError, match="normalises images by clip.vision.image_mean"):
        file.qwen2_5_vl_config(load_model(model_file, quantization="none").config)
