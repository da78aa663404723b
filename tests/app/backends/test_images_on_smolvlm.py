"""A chat's images reach a SmolVLM, whose images are tiles laid out for their size: the engine
in this process and Pagoda's own server over it lay each image out as its processor does, and
the meter counts an image's tiles."""

import pytest
from conftest import remote, run

from pagoda.app.backends import ChatMessage
from pagoda.app.backends.chat.local import LocalBackend
from pagoda.app.backends.images import count_chat
from pagoda.engine import LLM
from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.server.api import build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel
from tests.app.backends.test_images_on_a_vision_model import final_chunk, photo
from tests.engine.tiny_vision import SMOLVLM_TOKENS_PER_TILE, save_smolvlm, tiny_smolvlm


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    folder = save_smolvlm(tiny_smolvlm(), tmp_path_factory.mktemp("smolvlm"))
    backend = LocalBackend(AsyncEngine(engine=LLM(str(folder), num_threads=1,
                                                  num_kv_blocks=64).engine))
    yield backend
    backend.shutdown()


def test_a_chat_with_an_image_takes_its_tiles_and_the_meter_counts_them(local):
    """A 40 x 30 photo is 2 x 2 tiles and the whole image: five runs of placeholders."""
    asking = [ChatMessage("user", "what is this", images=(photo(0),))]
    last = run(final_chunk(local, asking))
    assert last.finish_reason == "length" and last.num_output_tokens == 4
    text_alone = run(final_chunk(local, [ChatMessage("user", "what is this")]))
    assert last.num_prompt_tokens >= text_alone.num_prompt_tokens + 5 * SMOLVLM_TOKENS_PER_TILE
    counted = run(count_chat(local, asking))
    assert abs(counted.n - last.num_prompt_tokens) <= 4
    assert local.image_input.cost.tokens(90, 30) < local.image_input.cost.tokens(40, 30)  # 3 < 5


def test_a_server_over_it_lays_the_image_out_as_the_engine_here_does(local):
    served = ServedModel("tiny-smolvlm", local.engine, local.engine.max_model_len)
    server = ServerThread(build_app(lambda: served)).start()
    try:
        asking = [ChatMessage("user", "what is this", images=(photo(2),))]
        here = run(final_chunk(local, asking))
        there = run(final_chunk(remote(f"{server.url}/v1"), asking))
    finally:
        server.stop()
    assert there.num_prompt_tokens == here.num_prompt_tokens
    assert there.text == here.text
