"""A Gemma 3 mmproj file, as llama.cpp's converter writes it, gives the folder's image tokens
(its matrices rounded to fp16, as the file holds them)."""

import pytest
import torch

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.linear import Placement
from pagoda.engine.loading.mmproj import MMProjFile
from pagoda.engine.models.vision_tower import gemma3_image_tower
from pagoda.kernels.kernel_ops import TORCH_OPS
from tests.engine.llama_cpp_converter import convert_mmproj
from tests.engine.tiny_gguf import write_tiny_gguf
from tests.engine.tiny_vision import save_gemma3_as_released, tiny_gemma3_vision

CPU = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)


@pytest.fixture(scope="module")
def gemma3():
    return tiny_gemma3_vision()


@pytest.fixture(scope="module")
def mmproj(gemma3, tmp_path_factory):
    folder = save_gemma3_as_released(gemma3, tmp_path_factory.mktemp("gemma3_vision"))
    return convert_mmproj(folder, folder / "mmproj-tiny-gemma3.f16.gguf")


@torch.no_grad()
def as_the_file_holds_it(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Its matrices at fp16 but the patch and position embeddings (kept float32)."""
    return {name: (t.half().float() if t.ndim == 2 and "embeddings" not in name else t)
            for name, t in state.items()}


def test_a_gemma3_mmproj_gives_the_folders_image_tokens(gemma3, mmproj):
    file = MMProjFile(mmproj)
    config = file.gemma3_config(gemma3.config.text_config.hidden_size)
    assert config.mm_tokens_per_image == gemma3.config.mm_tokens_per_image
    assert config.vision_config.num_hidden_layers == 2
    ours = gemma3_image_tower(config, file.weights(config), CPU)
    reference = gemma3_image_tower(gemma3.config, as_the_file_holds_it(gemma3.state_dict()), CPU)
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(pixels), reference(pixels), atol=1e-5, rtol=1e-5)


def test_a_language_model_file_is_not_taken_for_an_mmproj(tmp_path):
    tiny = write_tiny_gguf(tmp_path / "model.gguf")
    with pytest.raises(ModelLoadError, match="'llama' file, not a vision tower"):
        MMProjFile(tiny.path)
