"""A chat with an image on Gemma 3: the image's placeholders take the SigLIP tower's embeddings,
its tokens see each other (bidirectionally, within the windows), and the engine gives
transformers' logits whatever the prefill chunk; the same image again hits the prefix cache
and is not encoded again, another image is not mistaken for it."""

import io

import pytest
import torch
import transformers
from PIL import Image

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ImageInputError
from pagoda.engine.loading.loader import load_model
from pagoda.engine.multimodal.image_processing import image_processor
from pagoda.engine.multimodal.images import DecodedImage, decode_image_bytes
from pagoda.engine.multimodal.placeholders import image_spans
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.tiny_vision import (
    GEMMA3_TOKENS_PER_IMAGE,
    gemma3_tokenizer,
    save_gemma3_as_released,
    tiny_gemma3_vision,
)

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def gemma3():
    return tiny_gemma3_vision()


@pytest.fixture(scope="module")
def folder(gemma3, tmp_path_factory):
    return save_gemma3_as_released(gemma3, tmp_path_factory.mktemp("gemma3_vision"))


@pytest.fixture(scope="module")
def hf_model(folder):
    return transformers.Gemma3ForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager").eval()


def photo(seed: int, width: int = 50, height: int = 40) -> DecodedImage:
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    png = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(png, format="PNG")
    return decode_image_bytes(png.getvalue(), "image/png", f"photo {seed}")


def prompt(gemma3, images: int = 1, words: str = "the cat sat on the mat") -> list[int]:
    """Text, then each image as Gemma 3's processor lays it out (start, placeholders, end),
    then text again."""
    tokenizer = gemma3_tokenizer()
    c = gemma3.config
    text = tokenizer.encode(words, add_special_tokens=False)
    image = [c.boi_token_index, *[c.image_token_index] * GEMMA3_TOKENS_PER_IMAGE,
             c.eoi_token_index]
    return [tokenizer.bos_token_id, *text, *image * images, *text, *text]


@torch.inference_mode()
def hf_logits(hf_model, ids: list[int], pixels: list[torch.Tensor]) -> torch.Tensor:
    image_token = hf_model.config.image_token_index
    token_types = torch.tensor([[int(t == image_token) for t in ids]])
    return hf_model(input_ids=torch.tensor([ids]), pixel_values=torch.stack(pixels),
                    token_type_ids=token_types).logits[0]


@pytest.mark.parametrize("chunk", [256, 7])
@pytest.mark.parametrize("num_images", [1, 2])
def test_gemma3_with_images_gives_transformers_logits(gemma3, folder, hf_model, chunk,
                                                      num_images):
    """7-token chunks end anywhere but inside an image: one is cut before it or takes it whole.
    The tiny model's windows (8 tokens) are shorter than an image (16): a token sees the
    image's later tokens, and its earlier ones only within the window."""
    runner = ModelRunner(load_model(folder, quantization="none"),
                         EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1,
                                      vision_dtype="float32"))
    tower = runner.image_tower
    ids = prompt(gemma3, num_images)
    spans = image_spans(ids, [photo(i) for i in range(num_images)], tower.image_token_id,
                        image_processor(tower))
    ours = prompt_logits(runner, ids, chunk=chunk, images=spans)
    theirs = hf_logits(hf_model, ids, [s.pixels for s in spans])
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def run(llm: LLM, ids: list[int], images: list[DecodedImage], request_id: str,
        params: SamplingParams = GREEDY):
    """The request's finished output, stepped through the engine."""
    engine = llm.engine
    engine.add_request(request_id, ids, params, images=images)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                return out
    raise AssertionError("the request did not finish")


class CountingEncoder:
    """The tower's encoder, counting the images each call encodes."""

    def __init__(self, encoder, calls: list[int]) -> None:
        self.encoder, self.calls, self.shape = encoder, calls, encoder.shape

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls.append(pixels.shape[0])
        return self.encoder(pixels)


def counting_encodes(llm: LLM) -> list[int]:
    """Each call of the tower from now on, as the number of images it encoded."""
    tower, calls = llm.engine.runner.image_tower, []
    tower.encoder = CountingEncoder(tower.encoder, calls)
    return calls


def test_the_same_image_again_hits_the_prefix_cache_and_is_not_encoded(gemma3, folder):
    llm = LLM(str(folder), num_threads=1, num_kv_blocks=64)
    calls = counting_encodes(llm)
    ids = prompt(gemma3)
    first = run(llm, ids, [photo(0)], "first")
    again = run(llm, ids + first.outputs[0].token_ids, [photo(0)], "again")
    assert calls == [1]  # the first request's only
    image_end = ids.index(gemma3.config.eoi_token_index)
    assert again.num_cached_tokens > image_end


def test_after_a_restart_the_same_image_comes_from_the_disk_tier_and_is_not_encoded(
        gemma3, folder, tmp_path):
    """The disk tier keeps an image's blocks under its content hash: a new engine on the same
    folder answers a follow-up about it without the tower, as the cold engine answers it."""
    ids = prompt(gemma3)
    before = LLM(str(folder), num_threads=1, num_kv_blocks=64, disk_cache_dir=tmp_path)
    first = run(before, ids, [photo(0)], "first")
    before.engine.close()
    follow_up = ids + first.outputs[0].token_ids
    restarted = LLM(str(folder), num_threads=1, num_kv_blocks=64, disk_cache_dir=tmp_path)
    calls = counting_encodes(restarted)
    again = run(restarted, follow_up, [photo(0)], "again")
    assert calls == []
    assert again.num_cached_tokens > ids.index(gemma3.config.eoi_token_index)
    assert restarted.engine.stats().disk_cache.hits > 0
    cold = run(LLM(str(folder), num_threads=1, num_kv_blocks=64), follow_up, [photo(0)], "cold")
    assert again.outputs[0].token_ids == cold.outputs[0].token_ids


def test_another_image_behind_the_same_placeholders_is_not_taken_from_the_cache(gemma3, folder):
    llm = LLM(str(folder), num_threads=1, num_kv_blocks=64)
    calls = counting_encodes(llm)
    ids = prompt(gemma3)
    run(llm, ids, [photo(0)], "first")
    other = run(llm, ids, [photo(1)], "other")
    image_start = ids.index(gemma3.config.image_token_index)
    assert other.num_cached_tokens <= image_start
    assert calls == [1, 1]
    cold = run(LLM(str(folder), num_threads=1, num_kv_blocks=64), ids, [photo(1)], "cold")
    assert other.outputs[0].token_ids == cold.outputs[0].token_ids


def test_an_image_for_a_text_only_model_is_refused(tmp_path):
    from tests.engine.tiny_models import save_tiny_model
    llm = LLM(str(save_tiny_model(tmp_path / "llama", "llama")), num_threads=1, num_kv_blocks=16)
    with pytest.raises(ImageInputError, match="takes text only"):
        llm.engine.add_request("r", [1, 2, 3], GREEDY, images=[photo(0)])


def test_images_that_do_not_fit_the_placeholders_are_refused(gemma3, folder):
    llm = LLM(str(folder), num_threads=1, num_kv_blocks=64)
    with pytest.raises(ImageInputError, match="placeholders for 1 image.* but 2 image"):
        llm.engine.add_request("two", prompt(gemma3), GREEDY, images=[photo(0), photo(1)])
    short = [t for i, t in enumerate(prompt(gemma3))
             if not (t == gemma3.config.image_token_index and i % 5 == 0)]
    with pytest.raises(ImageInputError, match=r"are \d+ tokens, where this model gives each "
                                              r"image 16"):
        llm.engine.add_request("short", short, GREEDY, images=[photo(0)])
    assert not llm.engine.has_unfinished_requests()


def test_chunked_prefill_of_an_image_gives_the_tokens_of_one_prefill(gemma3, folder):
    """The scheduler's 7-token chunks cut before the image and take it whole."""
    ids = prompt(gemma3, 2)
    whole = run(LLM(str(folder), num_threads=1, num_kv_blocks=64), ids, [photo(0), photo(1)],
                "whole")
    chunked = run(LLM(str(folder), num_threads=1, num_kv_blocks=64, max_num_batched_tokens=7),
                  ids, [photo(0), photo(1)], "chunked")
    assert chunked.outputs[0].token_ids == whole.outputs[0].token_ids

