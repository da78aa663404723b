"""A Gemma 3 as users download it for images: the language model's GGUF and its mmproj, both
written by llama.cpp's converter from one multimodal folder. With an image, the pair gives
transformers' next token at every position (its logits at the files' fp16 rounding)."""

import pytest
import torch
import transformers

from pagoda.engine import LLM
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.loader import load_model
from pagoda.engine.multimodal.image_processing import image_processor
from pagoda.engine.multimodal.placeholders import image_spans
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.family_parity import assert_same_argmax
from tests.engine.llama_cpp_converter import convert_mmproj, convert_to_gguf
from tests.engine.multimodal.test_gemma3_images import hf_logits, photo, prompt
from tests.engine.tiny_gguf import write_tiny_gguf
from tests.engine.tiny_vision import save_gemma3_as_released, tiny_gemma3_vision


@pytest.fixture(scope="module")
def gemma3():
    return tiny_gemma3_vision()


@pytest.fixture(scope="module")
def files(gemma3, tmp_path_factory):
    folder = save_gemma3_as_released(gemma3, tmp_path_factory.mktemp("gemma3_vision"))
    return (folder, convert_to_gguf(folder, folder / "tiny-gemma3.f16.gguf"),
            convert_mmproj(folder, folder / "mmproj-tiny-gemma3.f16.gguf"))


@torch.no_grad()
def as_the_files_hold_it(model):
    """Its matrices at fp16 (the files' f16), its norms and the tower's embeddings float32."""
    for name, parameter in model.named_parameters():
        if parameter.ndim == 2 and "embeddings" not in name:
            parameter.copy_(parameter.half().float())
    return model


def test_a_gguf_and_its_mmproj_give_transformers_next_tokens_with_images(gemma3, files):
    folder, model_file, mmproj = files
    runner = ModelRunner(load_model(model_file, quantization="none", mmproj=mmproj),
                         EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                      vision_dtype="float32"))
    tower = runner.image_tower
    ids = prompt(gemma3, 2)
    spans = image_spans(ids, [photo(0), photo(1)], tower.image_token_id,
                        image_processor(tower))
    ours = prompt_logits(runner, ids, chunk=7, images=spans)
    reference = as_the_files_hold_it(transformers.Gemma3ForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager").eval())
    theirs = hf_logits(reference, ids, [s.pixels for s in spans])
    assert_same_argmax(ours, theirs, "two images")
    torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=1e-3)


def test_an_mmproj_beside_a_folder_is_refused(files):
    folder, _, mmproj = files
    with pytest.raises(ModelLoadError, match="holds its own vision tower"):
        LLM(str(folder), mmproj=mmproj)


def test_an_mmproj_beside_another_family_is_refused(files, tmp_path):
    _, _, mmproj = files
    llama = write_tiny_gguf(tmp_path / "llama.gguf").path
    with pytest.raises(ModelLoadError, match="Gemma 3 vision tower, and llama.gguf is a llama"):
        load_model(llama, mmproj=mmproj)
