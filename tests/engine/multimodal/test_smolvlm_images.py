"""A chat with images on SmolVLM: each image is cut into tiles as its processor cuts it (a grid
of the tower's side and the whole image after it, or the whole image alone), each tile's
placeholders take the tower's pixel-shuffled embeddings, and the engine gives transformers'
logits; the same image again hits the prefix cache and no tile is encoded again."""

import io
import json
import shutil

import pytest
import torch
import transformers
from PIL import Image

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ImageInputError, ModelLoadError
from pagoda.engine.loading.loader import load_model
from pagoda.engine.models.vision_tower import TileSettings
from pagoda.engine.multimodal.image_processing import TiledResize, image_processor, tile_grid
from pagoda.engine.multimodal.images import DecodedImage, decode_image_bytes
from pagoda.engine.multimodal.placeholders import SmolVLMTokens, image_spans, smolvlm_image_prompt
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.family_parity import assert_same_argmax
from tests.engine.multimodal.test_gemma3_images import counting_encodes, run
from tests.engine.tiny_vision import (
    SMOLVLM_TOKENS_PER_TILE,
    save_smolvlm,
    smolvlm_tokenizer,
    tiny_smolvlm,
)

TILE = 32


@pytest.fixture(scope="module")
def smolvlm():
    return tiny_smolvlm()


@pytest.fixture(scope="module")
def folder(smolvlm, tmp_path_factory):
    """Images resized to a longest edge of 64 and cut into 32-pixel tiles."""
    return save_smolvlm(smolvlm, tmp_path_factory.mktemp("smolvlm"))


@pytest.fixture(scope="module")
def whole_folder(smolvlm, tmp_path_factory):
    """The same model whose processor resizes images to one tile: none is cut."""
    return save_smolvlm(smolvlm, tmp_path_factory.mktemp("smolvlm_whole"), longest_edge=TILE)


def photo(seed: int, width: int, height: int) -> DecodedImage:
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    png = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(png, format="PNG")
    return decode_image_bytes(png.getvalue(), "image/png", f"photo {seed}")


def prompt(images: list[DecodedImage], longest_edge: int = 64) -> list[int]:
    """A user turn with the images, as SmolVLM's template and processor write it."""
    tiles = TileSettings(longest_edge)
    layout = smolvlm_image_prompt(SmolVLMTokens(), SMOLVLM_TOKENS_PER_TILE,
                                  lambda size: tile_grid(size, TILE, tiles))
    text = ("<|im_start|>User: the cat sat on the mat" + "<image>" * len(images)
            + " what is it?<end_of_utterance>\nAssistant:")
    return smolvlm_tokenizer().encode(layout.expand(text, [i.size for i in images]),
                                      add_special_tokens=False)


@torch.inference_mode()
def hf_logits(folder, ids: list[int], images: list[DecodedImage]) -> torch.Tensor:
    model = transformers.AutoModelForImageTextToText.from_pretrained(
        folder, attn_implementation="eager").eval()
    pixels = transformers.SmolVLMImageProcessorPil.from_pretrained(folder)(
        images=[[i.image for i in images]], return_tensors="pt")
    return model(input_ids=torch.tensor([ids]), **pixels).logits[0]


@pytest.mark.parametrize("sizes", [[(50, 40)], [(90, 30), (20, 70)]],
                         ids=["one-2x2", "two-1x2-2x1"])
def test_smolvlm_tiles_give_transformers_logits(folder, sizes):
    """An image of 50 x 40 becomes 64 x 52, 2 x 2 tiles and the whole; 90 x 30 one row of
    two; 20 x 70 two rows of one. 7-token chunks cut between the tiles."""
    runner = ModelRunner(load_model(folder, quantization="none"),
                         EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                      vision_dtype="float32"))
    tower = runner.image_tower
    images = [photo(i, *size) for i, size in enumerate(sizes)]
    ids = prompt(images)
    spans = image_spans(ids, images, tower.image_token_id, image_processor(tower))
    assert len(spans) == {1: 5, 2: 6}[len(images)]
    ours = prompt_logits(runner, ids, chunk=7, images=spans)
    theirs = hf_logits(folder, ids, images)
    assert_same_argmax(ours, theirs, str(sizes))
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_an_idefics3_folder_is_smolvlm_under_its_first_name(tmp_path):
    """SmolVLM-256M/500M/2B-Instruct are released as Idefics3ForConditionalGeneration."""
    folder = save_smolvlm(tiny_smolvlm(idefics3=True), tmp_path / "idefics3")
    runner = ModelRunner(load_model(folder, quantization="none"),
                         EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                      vision_dtype="float32"))
    tower = runner.image_tower
    images = [photo(0, 50, 40)]
    ids = prompt(images)
    spans = image_spans(ids, images, tower.image_token_id, image_processor(tower))
    ours = prompt_logits(runner, ids, chunk=7, images=spans)
    theirs = hf_logits(folder, ids, images)
    assert_same_argmax(ours, theirs, "idefics3")
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_smolvlm_image_of_one_tile_gives_transformers_logits(whole_folder):
    runner = ModelRunner(load_model(whole_folder, quantization="none"),
                         EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                      vision_dtype="float32"))
    tower = runner.image_tower
    images = [photo(0, 50, 40)]
    ids = prompt(images, longest_edge=TILE)
    spans = image_spans(ids, images, tower.image_token_id, image_processor(tower))
    assert len(spans) == 1
    ours = prompt_logits(runner, ids, chunk=7, images=spans)
    theirs = hf_logits(whole_folder, ids, images)
    assert_same_argmax(ours, theirs, "one tile")
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("size", [(50, 40), (90, 30), (20, 70), (64, 64), (1, 1), (300, 3),
                                  (3, 300), (33, 32)])
@pytest.mark.parametrize("split", [True, False])
def test_smolvlm_tiles_equal_transformers_processor(size, split):
    processor = transformers.SmolVLMImageProcessorPil(
        size={"longest_edge": 64}, max_image_size={"longest_edge": TILE},
        do_image_splitting=split, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    image = photo(1, *size).image
    want = processor(images=[[image]], return_tensors="pt", return_row_col_info=True)
    settings = TileSettings(64, split)
    got = TiledResize(TILE, settings)(image)
    torch.testing.assert_close(got, want["pixel_values"][0], atol=1e-6, rtol=0)
    assert tile_grid(image.size, TILE, settings) == (want["rows"][0][0], want["cols"][0][0])


def test_the_same_image_again_hits_the_prefix_cache_and_no_tile_is_encoded(folder):
    llm = LLM(str(folder), num_threads=1, num_kv_blocks=64)
    calls = counting_encodes(llm)
    images = [photo(0, 50, 40)]
    ids = prompt(images)
    first = run(llm, ids, images, "first")
    again = run(llm, ids + first.outputs[0].token_ids, [photo(0, 50, 40)], "again")
    assert sum(calls) == 5  # the first request's four tiles and whole image, no more
    last_image_token = len(ids) - 1 - ids[::-1].index(llm.engine.runner.image_tower.image_token_id)
    assert again.num_cached_tokens > last_image_token
    other = run(llm, ids, [photo(1, 50, 40)], "other")
    assert other.num_cached_tokens <= ids.index(llm.engine.runner.image_tower.image_token_id)
    assert sum(calls) == 10


def test_tiles_are_bounded_by_the_processor_whatever_the_image():
    """A sliver or a huge image is at most (longest edge / tile)^2 tiles and the whole."""
    settings = TileSettings(64)
    for size in ((16_000, 1), (1, 16_000), (5_000, 5_000), (1, 1)):
        rows, cols = tile_grid(size, TILE, settings)
        assert rows <= 2 and cols <= 2
    assert TiledResize(TILE, settings)(Image.new("RGB", (16_000, 1))).shape == (3, 3, TILE, TILE)


def test_a_processor_that_would_make_hundreds_of_tiles_is_refused(folder, tmp_path):
    copy = shutil.copytree(folder, tmp_path / "huge")
    settings = json.loads((copy / "preprocessor_config.json").read_text())
    settings["size"] = {"longest_edge": 100_000}
    (copy / "preprocessor_config.json").write_text(json.dumps(settings))
    with pytest.raises(ModelLoadError, match="longest edge of 100000 pixels, where 1 to 256"):
        load_model(copy, quantization="none")
    settings["size"] = {"longest_edge": 288}  # nine tiles of 32 a side
    (copy / "preprocessor_config.json").write_text(json.dumps(settings))
    with pytest.raises(ModelLoadError, match="at most 8 tiles of 32"):
        load_model(copy, quantization="none")
    settings["size"], settings["max_image_size"] = {"longest_edge": 64}, {"longest_edge": 48}
    (copy / "preprocessor_config.json").write_text(json.dumps(settings))
    with pytest.raises(ModelLoadError, match="max_image_size is 48 pixels, where the vision "
                                             "tower's tiles are 32"):
        load_model(copy, quantization="none")


def test_a_config_whose_placeholder_is_not_the_vocabularys_is_refused(folder, tmp_path):
    copy = shutil.copytree(folder, tmp_path / "other")
    config = json.loads((copy / "config.json").read_text())
    config["image_token_id"] = 5
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="image_token_id is 5, where other's vocabulary "
                                             "holds <image> as"):
        load_model(copy, quantization="none")


def test_placeholders_for_fewer_tiles_than_the_image_has_are_refused(folder):
    llm = LLM(str(folder), num_threads=1, num_kv_blocks=64)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    laid_out_for_one_row = prompt([photo(0, 90, 30)])  # two tiles and the whole
    with pytest.raises(ImageInputError, match=r"3 run\(s\) of image tokens but its 1 image\(s\) "
                                              r"are 5 tiles"):
        llm.engine.add_request("r", laid_out_for_one_row, greedy, images=[photo(0, 50, 40)])
    image = llm.engine.runner.image_tower.image_token_id
    ids = prompt([photo(0, 50, 40)])
    del ids[ids.index(image)]  # the first tile's run one short
    with pytest.raises(ImageInputError, match=r"tile 0's placeholders at token \d+ are 15 "
                                              r"tokens, where this model gives each tile 16"):
        llm.engine.add_request("short", ids, greedy, images=[photo(0, 50, 40)])
    assert not llm.engine.has_unfinished_requests()
