"""A chat's images reach a model that sees them: the engine in this process (a multimodal
Gemma 3) and Pagoda's own server over it, through the real openai client's shapes. The same
image in the next turn comes from the prefix cache; the meter knows an image's cost."""

import io

import pytest
import torch
from conftest import remote, run
from PIL import Image

from pagoda.app.backends import ChatMessage, SamplingOptions
from pagoda.app.backends.chat.local import LocalBackend
from pagoda.app.backends.images import count_chat, read_image
from pagoda.engine import LLM
from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.server.api import build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel
from tests.engine.tiny_vision import (
    GEMMA3_TOKENS_PER_IMAGE,
    save_gemma3_as_released,
    tiny_gemma3_vision,
)

OPTIONS = SamplingOptions(temperature=0, max_tokens=4)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    folder = save_gemma3_as_released(tiny_gemma3_vision(), tmp_path_factory.mktemp("gemma3"))
    backend = LocalBackend(AsyncEngine(engine=LLM(str(folder), num_threads=1,
                                                  num_kv_blocks=64).engine))
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def server(local):
    served = ServedModel("tiny-gemma3", local.engine, local.engine.max_model_len)
    running = ServerThread(build_app(lambda: served)).start()
    yield running
    running.stop()


def photo(seed: int, width: int = 40, height: int = 30):
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buffer, format="PNG")
    return read_image(buffer.getvalue(), f"photo-{seed}.png")


async def final_chunk(backend, messages):
    last = None
    async for chunk in backend.stream(messages, OPTIONS):
        last = chunk
    return last


def test_the_engine_here_sees_an_image_and_says_what_it_costs(local):
    assert local.image_input.accepts is True
    cost = local.image_input.cost.tokens(4000, 3000)
    assert cost == local.image_input.cost.tokens(10, 10) > GEMMA3_TOKENS_PER_IMAGE
    asking = [ChatMessage("user", "what is this", images=(photo(0),))]
    last = run(final_chunk(local, asking))
    assert last.finish_reason == "length" and last.num_output_tokens == 4
    text_alone = run(final_chunk(local, [ChatMessage("user", "what is this")]))
    assert last.num_prompt_tokens >= text_alone.num_prompt_tokens + GEMMA3_TOKENS_PER_IMAGE
    counted = run(count_chat(local, asking))
    assert abs(counted.n - last.num_prompt_tokens) <= 2  # the blank lines may merge


def test_the_next_turn_about_the_same_image_is_read_from_the_prefix_cache(local):
    first = [ChatMessage("user", "describe it", images=(photo(1),))]
    reply = run(final_chunk(local, first))
    follow_up = first + [ChatMessage("assistant", reply.text or "it is"),
                         ChatMessage("user", "and the colour")]
    again = run(final_chunk(local, follow_up))
    assert again.num_cached_tokens > GEMMA3_TOKENS_PER_IMAGE


def test_a_server_over_it_takes_the_image_as_the_engine_here_does(local, server):
    asking = [ChatMessage("user", "what is this", images=(photo(2),))]
    here = run(final_chunk(local, asking))
    there = run(final_chunk(remote(f"{server.url}/v1"), asking))
    assert there.num_prompt_tokens == here.num_prompt_tokens
    assert there.text == here.text
