"""A chat with images on Qwen2.5-VL: each image, at its own size, becomes a grid of tokens that
the windowed tower's merged patches fill, placed on that grid by multimodal RoPE; the engine
gives transformers' logits whatever the prefill chunk (chunks end inside an image, whose tokens
attend causally), its greedy tokens after an image, and the same image again hits the prefix
cache and is not encoded again."""

import io
import json
import shutil
from pathlib import Path
from dataclasses import replace

import pytest
import torch
import transformers
from PIL import Image
from safetensors.torch import load_file, save_file

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ImageInputError, ModelLoadError
from pagoda.engine.layers.grid_vision_encoder import window_order
from pagoda.engine.loading.loader import load_model
from pagoda.engine.multimodal.image_processing import GridResize, image_processor
from pagoda.engine.multimodal.images import DecodedImage, decode_image_bytes
from pagoda.engine.multimodal.placeholders import image_spans
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.family_parity import assert_same_argmax
from tests.engine.multimodal.test_gemma3_images import run
from tests.engine.tiny_vision import (
    QWEN2_5_VL_MAX_PIXELS,
    QWEN2_5_VL_MIN_PIXELS,
    qwen2_5_vl_tokenizer,
    save_qwen2_5_vl,
    tiny_qwen2_5_vl,
)

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
# Two sizes whose grids differ (9 x 7 and 11 x 5 merge units), each more than one window wide.
SIZES = ((250, 200), (150, 300))


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen2_5_vl()


@pytest.fixture(scope="module")
def folder(qwen, tmp_path_factory):
    return save_qwen2_5_vl(qwen, tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def hf_model(folder):
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def runner(folder):
    return ModelRunner(load_model(folder, quantization="none"),
                       EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                      vision_dtype="float32"))


def photo(seed: int, size: tuple[int, int] = SIZES[0]) -> DecodedImage:
    gen = torch.Generator().manual_seed(seed)
    width, height = size
    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    png = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(png, format="PNG")
    return decode_image_bytes(png.getvalue(), "image/png", f"photo {seed}")


def photos(count: int) -> list[DecodedImage]:
    return [photo(i, SIZES[i % len(SIZES)]) for i in range(count)]


def processor(model) -> GridResize:
    vision = model.config.vision_config
    return GridResize(vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size,
                      QWEN2_5_VL_MIN_PIXELS, QWEN2_5_VL_MAX_PIXELS)


def prompt(qwen, images: list[DecodedImage], words: str = "the cat sat on the mat") -> list[int]:
    """Text, then each image as Qwen's template lays it out (its start, a placeholder per merge
    unit, its end) followed by text, then text again."""
    tokenizer = qwen2_5_vl_tokenizer()
    c = qwen.config
    text = tokenizer.encode(words, add_special_tokens=False)
    ids = [*text]
    for image in images:
        tokens = processor(qwen).process(image.image).tokens
        ids += [c.vision_start_token_id, *[c.image_token_id] * tokens, c.vision_end_token_id,
                *text]
    return ids + text


def spans_of(runner, ids: list[int], images: list[DecodedImage]):
    tower = runner.image_tower
    return image_spans(ids, images, tower.image_token_id, image_processor(tower), whole=False)


@torch.inference_mode()
def hf_logits(hf_model, ids: list[int], spans) -> torch.Tensor:
    image_token = hf_model.config.image_token_id
    grids = torch.tensor([[1, s.pixels.rows, s.pixels.columns] for s in spans])
    return hf_model(input_ids=torch.tensor([ids]),
                    pixel_values=torch.cat([s.pixels.patches for s in spans]),
                    image_grid_thw=grids,
                    mm_token_type_ids=torch.tensor([[int(t == image_token) for t in ids]])
                    ).logits[0]


def test_pixels_equal_transformers_processor(qwen):
    vision = qwen.config.vision_config
    theirs = transformers.Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
        temporal_patch_size=vision.temporal_patch_size,
        size={"shortest_edge": QWEN2_5_VL_MIN_PIXELS, "longest_edge": QWEN2_5_VL_MAX_PIXELS})
    for size in (*SIZES, (20, 30), (2000, 900)):
        image = photo(1, size).image
        want = theirs(images=image, return_tensors="pt")
        got = processor(qwen)(image)
        assert [1, got.rows, got.columns] == want["image_grid_thw"][0].tolist()
        torch.testing.assert_close(got.patches, want["pixel_values"], atol=1e-5, rtol=0)


def test_an_image_too_long_for_its_width_is_refused(qwen):
    with pytest.raises(ImageInputError, match="at most 200 times longer than wide"):
        processor(qwen).size(2010, 10)


def test_windows_follow_transformers_order():
    """A 5 x 7 grid of merge units in windows of 2: six windows row by row, the last of each
    row one unit wide, the last row one unit high."""
    order, lengths = window_order(5, 7, 2)
    assert lengths == [4, 4, 4, 2, 4, 4, 4, 2, 2, 2, 2, 1]
    assert order[:8].tolist() == [0, 1, 7, 8, 2, 3, 9, 10]


@pytest.mark.parametrize("chunk", [512, 13])
@pytest.mark.parametrize("num_images", [1, 2])
def test_qwen2_5_vl_with_images_gives_transformers_logits(qwen, runner, hf_model, chunk,
                                                          num_images):
    """13-token chunks end inside the images: a chunk's image tokens take their rows of the
    image's embeddings, and their grid positions."""
    images = photos(num_images)
    ids = prompt(qwen, images)
    spans = spans_of(runner, ids, images)
    ours = prompt_logits(runner, ids, chunk=chunk, images=spans)
    theirs = hf_logits(hf_model, ids, spans)
    assert_same_argmax(ours, theirs, f"{num_images} image(s), chunks of {chunk}")
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


class CountingEncoder:
    """The tower's encoder, counting the images it encodes."""

    def __init__(self, encoder, calls: list[int]) -> None:
        self.encoder, self.calls, self.shape = encoder, calls, encoder.shape

    def __call__(self, grid):
        self.calls.append(grid.rows * grid.columns)
        return self.encoder(grid)


def counting_encodes(llm: LLM) -> list[int]:
    """Each image the tower encodes from now on, as its patches."""
    tower, calls = llm.engine.runner.image_tower, []
    tower.encoder = CountingEncoder(tower.encoder, calls)
    return calls


@torch.inference_mode()
def hf_greedy(hf_model, ids: list[int], spans, max_tokens: int
              ) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and their log-probabilities."""
    image_token = hf_model.config.image_token_id
    out = hf_model.generate(
        input_ids=torch.tensor([ids]), pixel_values=torch.cat([s.pixels.patches for s in spans]),
        image_grid_thw=torch.tensor([[1, s.pixels.rows, s.pixels.columns] for s in spans]),
        mm_token_type_ids=torch.tensor([[int(t == image_token) for t in ids]]),
        max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
        output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(ids):].tolist()
    return tokens, [torch.log_softmax(logits[0].float(), -1)[t].item()
                    for logits, t in zip(out.logits, tokens, strict=True)]


def test_decoding_after_images_gives_transformers_greedy_tokens(qwen, folder, runner, hf_model):
    """Each decoded token's position runs behind its index by what the images' grids save
    (98 here): its log-probability is transformers' too."""
    images = photos(2)
    ids = prompt(qwen, images)
    ours = run(LLM(str(folder), num_threads=1, num_kv_blocks=64, vision_dtype="float32"), ids,
               images, "greedy", replace(GREEDY, logprobs=1)).outputs[0]
    tokens, logprobs = hf_greedy(hf_model, ids, spans_of(runner, ids, images), GREEDY.max_tokens)
    assert list(ours.token_ids) == tokens
    torch.testing.assert_close(torch.tensor([lp.chosen.logprob for lp in ours.logprobs]),
                               torch.tensor(logprobs), atol=1e-5, rtol=0)


def test_the_same_image_again_hits_the_prefix_cache_and_is_not_encoded(qwen, folder):
    llm = LLM(str(folder), num_threads=1, num_kv_blocks=64)
    calls = counting_encodes(llm)
    images = photos(1)
    ids = prompt(qwen, images)
    first = run(llm, ids, images, "first")
    again = run(llm, ids + list(first.outputs[0].token_ids), images, "again")
    assert len(calls) == 1  # the first request's only
    assert again.num_cached_tokens > ids.index(qwen.config.vision_end_token_id)
    cold = run(LLM(str(folder), num_threads=1, num_kv_blocks=64),
               ids + list(first.outputs[0].token_ids), images, "cold")
    assert again.outputs[0].token_ids == cold.outputs[0].token_ids


def test_another_image_of_the_same_size_is_not_taken_from_the_cache(qwen, folder):
    llm = LLM(str(folder), num_threads=1, num_kv_blocks=64)
    calls = counting_encodes(llm)
    ids = prompt(qwen, [photo(0)])
    run(llm, ids, [photo(0)], "first")
    other = run(llm, ids, [photo(5)], "other")
    assert other.num_cached_tokens <= ids.index(qwen.config.image_token_id)
    assert len(calls) == 2


def test_chunked_prefill_inside_images_gives_the_tokens_of_one_prefill(qwen, folder):
    """The scheduler's 13-token chunks end inside both images; each is encoded once."""
    images = photos(2)
    ids = prompt(qwen, images)
    whole = run(LLM(str(folder), num_threads=1, num_kv_blocks=64), ids, images, "whole")
    llm = LLM(str(folder), num_threads=1, num_kv_blocks=64, max_num_batched_tokens=13)
    calls = counting_encodes(llm)
    chunked = run(llm, ids, images, "chunked")
    assert chunked.outputs[0].token_ids == whole.outputs[0].token_ids
    assert len(calls) == 2


def test_placeholders_that_do_not_fit_the_image_are_refused(qwen, folder):
    llm = LLM(str(folder), num_threads=1, num_kv_blocks=64)
    ids = prompt(qwen, [photo(0, SIZES[0])])
    with pytest.raises(ImageInputError, match=r"are 63 tokens, where this model gives this "
                                              r"150 x 300 image 55"):
        llm.engine.add_request("other size", ids, GREEDY, images=[photo(0, SIZES[1])])


def test_a_folder_under_transformers_module_names_gives_the_same_logits(qwen, folder, runner,
                                                                         tmp_path):
    """transformers 5's own modules name the text model model.language_model.* and the tower
    model.visual.* (its saves, as Qwen's checkpoints, model.* and visual.*); a config.json may
    hold the text model's settings at its top, the sections as rope_scaling of type "mrope", as
    Qwen's do."""
    renamed = Path(shutil.copytree(folder, tmp_path / "renamed"))
    path = renamed / "model.safetensors"
    tensors = load_file(path)
    assert "model.layers.0.mlp.up_proj.weight" in tensors and "visual.merger.ln_q.weight" in tensors
    save_file({("model.language_model." + name[len("model."):] if name.startswith("model.")
                else "model." + name if name.startswith("visual.") else name): t
               for name, t in tensors.items()}, path, metadata={"format": "pt"})
    config = json.loads((renamed / "config.json").read_text())
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    config |= {k: v for k, v in text.items() if k not in ("model_type", "dtype")}
    config |= {"rope_theta": rope["rope_theta"],
               "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}}
    (renamed / "config.json").write_text(json.dumps(config))
    theirs = ModelRunner(load_model(renamed, quantization="none"),
                         EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                      vision_dtype="float32"))
    images = photos(1)
    ids = prompt(qwen, images)
    torch.testing.assert_close(prompt_logits(theirs, ids, images=spans_of(theirs, ids, images)),
                               prompt_logits(runner, ids, images=spans_of(runner, ids, images)),
                               atol=0, rtol=0)


def test_a_folder_missing_a_tower_tensor_is_refused_in_words(folder, tmp_path):
    damaged = Path(shutil.copytree(folder, tmp_path / "damaged"))
    path = damaged / "model.safetensors"
    tensors = {name: t for name, t in load_file(path).items()
               if name != "visual.blocks.1.mlp.up_proj.weight"}
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="blocks.1.mlp.up_proj.weight is missing"):
        LLM(str(damaged), num_threads=1, num_kv_blocks=16)
