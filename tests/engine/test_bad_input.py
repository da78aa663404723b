"""Input a user can get wrong is refused with an error that names the culprit, before any compute."""

import asyncio

import pytest

from pagoda.engine import (
    LLM,
    AsyncEngine,
    InvalidTextError,
    ModelLoadError,
    PromptTooLongError,
    SamplingParams,
)

# One thread: with the two cores shared by other processes, two OpenMP threads spin against each
# other and a step gets ~30x slower.
ENGINE = {"num_kv_blocks": 64, "num_threads": 1}


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(**ENGINE)


@pytest.mark.parametrize("prompts", ["", [[]], ["Hello", ""]],
                         ids=["empty text", "empty token list", "one empty in a batch"])
def test_empty_prompt_is_refused_and_leaves_nothing_behind(llm, prompts):
    with pytest.raises(ValueError, match="the prompt is empty"):
        llm.generate(prompts)
    assert not llm.engine.has_unfinished_requests()
    llm.engine.step()  # collects whatever the refused batch left in the scheduler
    stats = llm.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)


def test_prompt_longer_than_max_model_len_names_both_lengths(make_llm):
    llm = make_llm(**ENGINE, max_model_len=64)
    with pytest.raises(PromptTooLongError, match="the prompt has 100 tokens .* context holds 64"):
        llm.generate(list(range(1000, 1100)))


def test_prompt_one_token_short_of_max_model_len_gets_exactly_one_token(make_llm):
    llm = make_llm(**ENGINE, max_model_len=64)
    out = llm.generate(list(range(1000, 1063)), SamplingParams(temperature=0, ignore_eos=True))[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.outputs[0].token_ids) == 1
    with pytest.raises(PromptTooLongError, match="has 64 tokens"):
        llm.generate(list(range(1000, 1064)))


def test_prompt_longer_than_the_default_context_window_is_refused(llm):
    assert llm.engine.max_model_len == 8192
    with pytest.raises(PromptTooLongError, match="has 9000 tokens .* context holds 8192"):
        llm.generate([1000] * 9000)


def test_prompt_larger_than_the_kv_cache_names_the_setting_to_raise(llm):
    capacity = 64 * 16
    with pytest.raises(PromptTooLongError, match=f"KV cache holds {capacity}.*num_kv_blocks"):
        llm.generate([1000] * 2000)


def test_prompt_larger_than_a_cache_sized_in_bytes_names_kv_cache_memory(make_llm):
    llm = make_llm(num_kv_blocks=None, kv_cache_memory=8 << 20)
    with pytest.raises(PromptTooLongError, match="raise EngineConfig.kv_cache_memory"):
        llm.generate([1000] * 2000)


def test_chat_without_messages_is_refused(llm):
    with pytest.raises(ValueError, match="chat\\(\\) needs messages"):
        llm.chat([])


def test_prompt_too_long_is_a_value_error():
    assert issubclass(PromptTooLongError, ValueError)


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -1.0),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_k", -5),
    ("max_tokens", 0),
    ("min_p", 2.0),
    ("repetition_penalty", 0.0),
    ("presence_penalty", 3.0),
    ("frequency_penalty", -3.0),
    ("stop", [""]),
    ("stop_token_ids", [-1]),
    ("temperature", float("inf")),
    ("temperature", float("nan")),
    ("temperature", "0.5"),
    ("top_p", None),
    ("top_k", 2.0),
    ("top_k", True),
    ("max_tokens", 8.0),
    ("seed", 1 << 64),
    ("seed", -1),
    ("seed", 3.0),
    ("stop", 5),
    ("stop", [b"bytes"]),
    ("stop_token_ids", [1.0]),
    ("stop", ["end\ud83d"]),
    ("stop_token_ids", "12"),
    ("ignore_eos", "yes"),
])
def test_invalid_sampling_value_names_its_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}="):
        SamplingParams(**{field: value})


def test_no_stop_strings_or_stop_tokens_may_be_given_as_none():
    params = SamplingParams(stop=None, stop_token_ids=None)
    assert params.stop == [] and params.stop_token_ids == []


@pytest.mark.parametrize("token_id", [49152, -1, 10**9])
def test_token_id_outside_the_vocabulary_is_refused(llm, token_id):
    with pytest.raises(ValueError, match=f"token id {token_id} is outside the vocabulary"):
        llm.generate([1000, token_id, 1001])


@pytest.mark.parametrize(("messages", "message"), [
    ([{"content": "hi"}], r"messages\[0\] must be a mapping with 'role' and 'content'"),
    ([{"role": "user"}], r"messages\[0\] must be a mapping with 'role' and 'content'"),
    ([{"role": "wizard", "content": "hi"}], r"messages\[0\]\.role='wizard' must be one of"),
    ([{"role": "user", "content": "hi"}, {"role": "user", "content": 3}],
     r"messages\[1\]\.content must be a string"),
], ids=["missing role", "missing content", "unknown role", "content not text"])
def test_invalid_chat_message_is_refused(llm, messages, message):
    with pytest.raises(ValueError, match=message):
        llm.chat(messages)


def test_prompt_with_a_lone_surrogate_is_refused_naming_where(llm):
    with pytest.raises(InvalidTextError, match=r"the prompt holds a lone surrogate U\+D83D at "
                                               r"character 6"):
        llm.generate("Hello \ud83d world")
    assert not llm.engine.has_unfinished_requests()


def test_chat_message_with_a_lone_surrogate_is_refused_naming_the_message(llm):
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": "\udc00"}]
    with pytest.raises(InvalidTextError, match=r"messages\[1\]\.content holds a lone surrogate"):
        llm.chat(messages)


def test_stream_with_a_lone_surrogate_fails_that_stream_only(make_engine):
    engine = AsyncEngine(engine=make_engine(**ENGINE))
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)

    async def scenario() -> str:
        with pytest.raises(InvalidTextError):
            [out async for out in engine.stream("bad \ud800", params)]
        with pytest.raises(InvalidTextError):
            [out async for out in engine.stream([{"role": "user", "content": "\ud800"}], params)]
        return [out async for out in engine.stream("good", params)][-1].outputs[0].finish_reason

    try:
        assert asyncio.run(asyncio.wait_for(scenario(), 30)) == "length"
    finally:
        engine.shutdown()


@pytest.mark.parametrize("prompt", ["a\x00b", "\x00"], ids=["inside", "alone"])
def test_nul_character_in_a_prompt_is_ordinary_text(llm, prompt):
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))[0]
    assert out.prompt_token_ids == llm.tokenizer.encode(prompt)
    assert out.outputs[0].finish_reason == "length"


def test_wrong_number_of_sampling_params_is_refused(llm):
    with pytest.raises(ValueError, match="got 2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams(), SamplingParams()])


def test_missing_model_path_names_the_path():
    with pytest.raises(ModelLoadError, match="/nonexistent/x"):
        LLM("/nonexistent/x", num_threads=1)


def test_request_id_used_twice_while_live_is_refused(make_engine):
    engine = make_engine(**ENGINE)
    engine.add_request("same", "Hello", SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="request_id 'same' is already running"):
        engine.add_request("same", "Hi", SamplingParams(max_tokens=4))


def run_to_end(engine, request_id: str):
    finished = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == request_id and out.finished:
                finished = out
    return finished


def test_request_id_is_free_again_once_its_request_finished(make_engine):
    engine = make_engine(**ENGINE)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    engine.add_request("same", "Hello", params)
    first = run_to_end(engine, "same")
    engine.add_request("same", "Hello", params)
    assert run_to_end(engine, "same").outputs[0].token_ids == first.outputs[0].token_ids


def test_request_id_reused_right_after_abort_runs_the_new_request(make_engine):
    # A prompt needing several steps of prefill: the new request gets no token in the first step
    # after the abort, when the aborted request's leftovers are collected.
    engine = make_engine(**ENGINE, max_num_batched_tokens=16)
    prompt = list(range(1000, 1060))
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    engine.add_request("regenerate", prompt, params)
    engine.step()
    assert engine.abort_request("regenerate").outputs[0].finish_reason == "abort"
    engine.add_request("regenerate", prompt, params)
    final = run_to_end(engine, "regenerate")
    assert final.outputs[0].finish_reason == "length"
    assert len(final.outputs[0].token_ids) == 3
    assert not engine.scheduler.running and engine.stats().kv_cache_usage == 0.0
