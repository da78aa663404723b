"""A SmolVLM as users download it for images: the language model's GGUF ("llama") and its
mmproj ("idefics3"), both written by llama.cpp's converter from one folder. The mmproj states
the processor's longest edge (clip.vision.preproc_image_size), so its images are cut into the
folder's tiles; with them the pair gives transformers' next token at every position (its
logits at the files' fp16 rounding)."""

import pytest
import torch
import transformers

from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.loader import load_model
from pagoda.engine.multimodal.image_processing import image_processor
from pagoda.engine.multimodal.placeholders import image_spans
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.family_parity import assert_same_argmax
from tests.engine.llama_cpp_converter import convert_mmproj, convert_to_gguf
from tests.engine.loading.test_gguf_with_mmproj import as_the_files_hold_it
from tests.engine.multimodal.test_smolvlm_images import TILE, photo, prompt
from tests.engine.tiny_gguf import write_tiny_gguf
from tests.engine.tiny_vision import save_smolvlm, tiny_smolvlm


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The folder, its text model's GGUF, its mmproj, and the mmproj of the same model whose
    processor cuts no image (its longest edge one tile)."""
    model = tiny_smolvlm()
    folder = save_smolvlm(model, tmp_path_factory.mktemp("smolvlm"))
    whole = save_smolvlm(model, tmp_path_factory.mktemp("smolvlm_whole"), longest_edge=TILE)
    return (folder, convert_to_gguf(folder, folder / "tiny-smolvlm.f16.gguf"),
            convert_mmproj(folder, folder / "mmproj-tiny-smolvlm.f16.gguf"),
            convert_mmproj(whole, whole / "mmproj-tiny-smolvlm-whole.f16.gguf"))


@torch.inference_mode()
def hf_logits(folder, ids, images, longest_edge: int) -> torch.Tensor:
    model = as_the_files_hold_it(transformers.SmolVLMForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager").eval())
    processor = transformers.SmolVLMImageProcessorPil.from_pretrained(
        folder, size={"longest_edge": longest_edge})
    pixels = processor(images=[[i.image for i in images]], return_tensors="pt")
    return model(input_ids=torch.tensor([ids]), **pixels).logits[0]


@pytest.mark.parametrize("cut", [True, False], ids=["tiles", "whole"])
def test_a_gguf_and_its_mmproj_give_transformers_next_tokens_with_images(files, cut):
    folder, model_file, mmproj, whole_mmproj = files
    runner = ModelRunner(load_model(model_file, quantization="none",
                                    mmproj=mmproj if cut else whole_mmproj),
                         EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                      vision_dtype="float32"))
    tower = runner.image_tower
    longest_edge = 64 if cut else TILE
    assert tower.tiles.longest_edge == longest_edge
    images = [photo(0, 50, 40), photo(1, 90, 30)]
    ids = prompt(images, longest_edge)
    spans = image_spans(ids, images, tower.image_token_id, image_processor(tower))
    assert len(spans) == (8 if cut else 2)
    ours = prompt_logits(runner, ids, chunk=7, images=spans)
    theirs = hf_logits(folder, ids, images, longest_edge)
    assert_same_argmax(ours, theirs, "two images")
    torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=1e-3)


def test_a_smolvlm_mmproj_beside_a_model_without_its_image_tokens_is_refused(files, tmp_path):
    _, _, mmproj, _ = files
    llama = write_tiny_gguf(tmp_path / "llama.gguf").path
    with pytest.raises(ModelLoadError, match="vocabulary has no <fake_token_around_image>"):
        load_model(llama, mmproj=mmproj)


def test_a_smolvlm_mmproj_beside_another_family_is_refused(files, tmp_path):
    _, _, mmproj, _ = files
    qwen3 = write_tiny_gguf(tmp_path / "qwen3.gguf", architecture="qwen3").path
    with pytest.raises(ModelLoadError, match="SmolVLM vision tower, and qwen3.gguf is a qwen3 "
                                             "model"):
        load_model(qwen3, mmproj=mmproj)
