"""A chat's images reach a local Qwen2.5-VL: each image costs the tokens its size gives, which
the meter knows exactly, and the next turn about the same image comes from the prefix cache."""

import pytest
from conftest import run

from pagoda.app.backends import ChatMessage
from pagoda.app.backends.chat.local import LocalBackend
from pagoda.app.backends.images import count_chat
from pagoda.engine import LLM
from pagoda.engine.async_engine import AsyncEngine
from tests.app.backends.test_images_on_a_vision_model import final_chunk, photo
from tests.engine.tiny_vision import save_qwen2_5_vl, tiny_qwen2_5_vl


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    folder = save_qwen2_5_vl(tiny_qwen2_5_vl(), tmp_path_factory.mktemp("qwen2_5_vl"))
    backend = LocalBackend(AsyncEngine(engine=LLM(str(folder), num_threads=1,
                                                  num_kv_blocks=64).engine))
    yield backend
    backend.shutdown()


def test_each_image_costs_what_its_size_gives_and_the_meter_counts_it_exactly(local):
    cost = local.image_input.cost
    assert local.image_input.accepts is True and cost.exact
    assert cost.tokens(250, 200) == 9 * 7 + 2  # merge units of 28 pixels, and its two markers
    assert cost.tokens(2000, 1500) > cost.tokens(250, 200)
    images = (photo(0, 250, 200), photo(1, 150, 300))
    asking = [ChatMessage("user", "what is this", images=images)]
    last = run(final_chunk(local, asking))
    text_alone = run(final_chunk(local, [ChatMessage("user", "what is this")]))
    assert last.num_prompt_tokens == (text_alone.num_prompt_tokens + cost.tokens(250, 200)
                                      + cost.tokens(150, 300))
    assert run(count_chat(local, asking)).n == last.num_prompt_tokens


def test_the_next_turn_about_the_same_image_is_read_from_the_prefix_cache(local):
    first = [ChatMessage("user", "describe it", images=(photo(2, 250, 200),))]
    reply = run(final_chunk(local, first))
    follow_up = first + [ChatMessage("assistant", reply.text or "it is"),
                         ChatMessage("user", "and the colour")]
    again = run(final_chunk(local, follow_up))
    assert again.num_cached_tokens > 9 * 7
