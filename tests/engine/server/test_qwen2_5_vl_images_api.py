"""A chat with images through the real `openai` client, on a Qwen2.5-VL: each image_url part
becomes as many placeholders as the image's size gives (transformers' processor's count), and
the reply is transformers' greedy one."""

import copy

import openai
import pytest
import torch
import transformers

from pagoda.engine import LLM
from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.models.vision_tower import QWEN2_5_VL_MAX_PIXELS, QWEN2_5_VL_MIN_PIXELS
from pagoda.engine.server.api import build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel
from tests.engine.server.test_images_api import data_url, token_bytes
from tests.engine.tiny_vision import (
    QWEN2_5_VL_IMAGE_TOKENS,
    qwen2_5_vl_tokenizer,
    save_qwen2_5_vl,
    tiny_qwen2_5_vl,
)

MODEL = "tiny-qwen2.5-vl"
TOKENS = 6
SIZES = ((250, 200), (150, 300))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_qwen2_5_vl(tiny_qwen2_5_vl(), tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def client(folder):
    engine = AsyncEngine(engine=LLM(str(folder), num_threads=1, num_kv_blocks=64,
                                    vision_dtype="float32").engine)
    served = ServedModel(MODEL, engine, engine.max_model_len)
    running = ServerThread(build_app(lambda: served)).start()
    yield openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0,
                        timeout=60)
    running.stop()
    engine.shutdown()


def photo(seed: int, size: tuple[int, int]):
    from PIL import Image
    gen = torch.Generator().manual_seed(seed)
    width, height = size
    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


@torch.inference_mode()
def transformers_reply(folder, images, text: str) -> tuple[int, list[bytes]]:
    """transformers' own image processor, its processor's expansion of each <|image_pad|> (one
    per merge unit; Qwen2_5_VLProcessor itself needs torchvision for its video side), and its
    greedy generation on the same chat: the prompt's length and each reply token's bytes."""
    tokenizer = copy.deepcopy(qwen2_5_vl_tokenizer())
    vision = transformers.AutoConfig.from_pretrained(folder).vision_config
    pixels = transformers.Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
        temporal_patch_size=vision.temporal_patch_size,
        size={"shortest_edge": QWEN2_5_VL_MIN_PIXELS, "longest_edge": QWEN2_5_VL_MAX_PIXELS},
    )(images=images, return_tensors="pt")
    start, pad, end = QWEN2_5_VL_IMAGE_TOKENS
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": (start + pad + end) * len(images) + text}], tokenize=False,
        add_generation_prompt=True)
    for grid in pixels["image_grid_thw"]:
        count = int(grid.prod()) // vision.spatial_merge_size ** 2
        prompt = prompt.replace(start + pad, start + "<placed>" * count, 1)
    ids = tokenizer(prompt.replace("<placed>", pad), add_special_tokens=False,
                    return_tensors="pt")["input_ids"]
    image_token = tokenizer.convert_tokens_to_ids(pad)
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32).eval()
    out = model.generate(input_ids=ids, pixel_values=pixels["pixel_values"],
                         image_grid_thw=pixels["image_grid_thw"],
                         mm_token_type_ids=(ids == image_token).int(), max_new_tokens=TOKENS,
                         min_new_tokens=TOKENS, do_sample=False)
    return ids.shape[1], [token_bytes(t) for t in
                          tokenizer.convert_ids_to_tokens(out[0, ids.shape[1]:].tolist())]


def test_a_chat_with_two_images_gets_transformers_prompt_and_reply(client, folder):
    images = [photo(i, size) for i, size in enumerate(SIZES)]
    content = [*({"type": "image_url", "image_url": {"url": data_url(image)}}
                 for image in images),
               {"type": "text", "text": "the cat sat on the mat"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=TOKENS,
        temperature=0, logprobs=True)
    prompt_tokens, tokens = transformers_reply(folder, images, "the cat sat on the mat")
    assert reply.usage.prompt_tokens == prompt_tokens
    assert [bytes(t.bytes) for t in reply.choices[0].logprobs.content] == tokens
