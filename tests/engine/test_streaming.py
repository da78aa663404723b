"""Streaming through AsyncEngine: deltas, stop strings, aborts, concurrency, seeds and bad requests.

pytest-asyncio is not a dependency, so each test drives its coroutine with asyncio.run.
"""

import asyncio
import threading
import time
import unicodedata

import pytest

from pagoda.engine import AsyncEngine, EngineConfig, RequestOutput, SamplingParams
from pagoda.engine.text.chat_template import encode_chat
from tests.engine.tokenizer_threads import note_encoding_threads

# One thread: with the two cores shared by other processes, two OpenMP threads spin against each
# other and a step gets ~30x slower.
ENGINE = {"num_kv_blocks": 128, "num_threads": 1}
# Fits the 2048-token KV cache but takes far longer (>10 ms a token) than an abort's wait allows.
ENDLESS = SamplingParams(temperature=0, max_tokens=1900, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(make_engine):
    async_engine = AsyncEngine(engine=make_engine(**ENGINE))
    yield async_engine
    async_engine.shutdown()


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(**ENGINE)


async def collect(engine: AsyncEngine, prompt, params: SamplingParams,
                  request_id: str | None = None) -> list[RequestOutput]:
    return [out async for out in engine.stream(prompt, params, request_id=request_id)]


def run(engine: AsyncEngine, prompt, params: SamplingParams) -> list[RequestOutput]:
    return asyncio.run(collect(engine, prompt, params))


def joined_deltas(outputs: list[RequestOutput]) -> str:
    return "".join(out.outputs[0].delta_text for out in outputs)


async def wait_until_idle(engine: AsyncEngine, timeout: float = 3.0) -> None:
    """Wait for the engine thread to publish stats with nothing running and no block in use."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache_usage == 0.0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine is still busy: {engine.stats()}")


def splits_a_character(tokenizer, token_ids: list[int]) -> bool:
    """Whether some token holds only part of a character's UTF-8 bytes."""
    return any("\ufffd" in tokenizer.decode([t]) for t in token_ids)


def assert_clean_stream(outputs: list[RequestOutput]) -> str:
    final = outputs[-1]
    assert final.finished and all(not out.finished for out in outputs[:-1])
    assert joined_deltas(outputs) == final.outputs[0].text
    assert not any("\ufffd" in out.outputs[0].delta_text for out in outputs)
    return final.outputs[0].text


@pytest.mark.slow
def test_chinese_deltas_join_to_the_text_without_broken_characters(engine):
    # A Chinese prompt given as token ids makes the model continue in Chinese.
    prompt = engine.tokenizer.encode("北京是中国的首都，")
    outputs = run(engine, prompt, SamplingParams(temperature=0, max_tokens=12))
    text = assert_clean_stream(outputs)
    assert sum(unicodedata.name(c, "").startswith("CJK") for c in text) >= 4
    assert splits_a_character(engine.tokenizer, outputs[-1].outputs[0].token_ids)


@pytest.mark.slow
def test_chinese_chat_reply_streams_cleanly(engine):
    outputs = run(engine, [{"role": "user", "content": "请用中文介绍北京。"}],
                  SamplingParams(temperature=0, max_tokens=24))
    text = assert_clean_stream(outputs)
    assert any(unicodedata.name(c, "").startswith("CJK") for c in text)


@pytest.mark.slow
def test_emoji_deltas_join_to_the_text_without_broken_characters(engine):
    outputs = run(engine, [{"role": "user", "content": "Reply with three emoji"}],
                  SamplingParams(temperature=0, max_tokens=12))
    text = assert_clean_stream(outputs)
    assert any(ord(c) > 0xFFFF for c in text)
    assert splits_a_character(engine.tokenizer, outputs[-1].outputs[0].token_ids)


@pytest.mark.slow
def test_stop_string_is_cut_from_the_streamed_text(engine):
    question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    full = run(engine, question, SamplingParams(temperature=0, max_tokens=32))[-1].outputs[0]
    assert "France is" in full.text
    outputs = run(engine, question, SamplingParams(temperature=0, max_tokens=32, stop="France is"))
    text = assert_clean_stream(outputs)
    assert outputs[-1].outputs[0].finish_reason == "stop"
    assert "France is" not in text
    assert text == full.text[:full.text.index("France is")]
    assert len(outputs[-1].outputs[0].token_ids) < len(full.token_ids)


def test_abort_mid_stream_ends_it_with_abort_and_frees_its_blocks(engine):
    async def scenario() -> list[RequestOutput]:
        outputs = []
        async for out in engine.stream("Once upon a time", ENDLESS, request_id="to-abort"):
            outputs.append(out)
            if len(outputs) == 3:
                engine.abort("to-abort")
        await wait_until_idle(engine)
        return outputs

    outputs = asyncio.run(scenario())
    final = outputs[-1].outputs[0]
    assert final.finish_reason == "abort"
    assert len(final.token_ids) < ENDLESS.max_tokens
    assert joined_deltas(outputs) == final.text


def test_breaking_out_of_a_stream_aborts_its_request(engine):
    async def scenario() -> None:
        async for out in engine.stream("Once upon a time", ENDLESS):
            if len(out.outputs[0].token_ids) >= 2:
                break
        await wait_until_idle(engine)

    asyncio.run(scenario())


def test_a_stream_kept_after_break_is_aborted_when_its_task_ends(engine):
    kept = []  # outlives the task: the generator is never closed nor collected

    async def reader() -> None:
        stream = engine.stream("Once upon a time", ENDLESS)
        kept.append(stream)
        async for out in stream:
            if len(out.outputs[0].token_ids) >= 2:
                break

    async def scenario() -> RequestOutput:
        await asyncio.create_task(reader())
        await wait_until_idle(engine)
        return [out async for out in kept[0]][-1]

    final = asyncio.run(scenario())
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert len(final.outputs[0].token_ids) < ENDLESS.max_tokens


def test_a_stream_read_to_its_end_is_not_aborted_when_its_task_ends(engine):
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)

    async def scenario() -> list[RequestOutput]:
        outputs = await asyncio.create_task(collect(engine, "Hello", params))
        await asyncio.sleep(0.05)  # a stray abort would reach the engine by now
        return outputs

    outputs = asyncio.run(scenario())
    assert outputs[-1].outputs[0].finish_reason == "length"
    assert not engine._inbox.qsize()


@pytest.mark.slow
def test_concurrent_streams_all_finish_and_match_llm_generate(engine, llm):
    prompts = ["The capital of France is", "def fibonacci(n):", "My favourite colour is",
               "Water boils at"]
    params = SamplingParams(temperature=0, max_tokens=16)

    async def scenario() -> list[list[RequestOutput]]:
        return await asyncio.gather(*(collect(engine, p, params) for p in prompts))

    streamed = asyncio.run(scenario())
    expected = llm.generate(prompts, params)
    for outputs, want in zip(streamed, expected, strict=True):
        assert_clean_stream(outputs)
        assert outputs[-1].outputs[0].token_ids == want.outputs[0].token_ids
        assert outputs[-1].outputs[0].text == want.outputs[0].text


def test_a_step_wakes_the_loop_of_its_streams_once(engine):
    prompts = ["The capital of France is", "def fibonacci(n):", "My favourite colour is",
               "Water boils at"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    wake_ups = []

    async def scenario() -> list[list[RequestOutput]]:
        loop = asyncio.get_running_loop()
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counted(callback, *args):
            wake_ups.append(threading.current_thread().name)
            return call_soon_threadsafe(callback, *args)

        loop.call_soon_threadsafe = counted
        return await asyncio.gather(*(collect(engine, p, params) for p in prompts))

    streamed = asyncio.run(scenario())
    assert all(len(outputs) == 12 for outputs in streamed)  # one output a token, each stream
    engine_wake_ups = wake_ups.count("pagoda-engine")
    # Four streams of 12 tokens: 48 outputs, in ~12 steps if all four run in each (plus a few
    # while they join), not one wake-up an output (fewer where steps are short enough for
    # outputs to wait for the next: see below).
    assert 2 <= engine_wake_ups <= 20, wake_ups


def test_short_steps_wake_a_streams_loop_about_sixty_times_a_second_its_first_token_at_once(
        tiny_model_folder):
    engine = AsyncEngine(tiny_model_folder, EngineConfig(num_kv_blocks=64, num_threads=1))
    params = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)
    wake_ups = []  # how many outputs each wake-up of the loop brought

    async def scenario() -> tuple[list[RequestOutput], float]:
        loop = asyncio.get_running_loop()
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counted(callback, batch):
            if threading.current_thread().name == "pagoda-engine":
                wake_ups.append(len(batch))
            return call_soon_threadsafe(callback, batch)

        loop.call_soon_threadsafe = counted
        start = time.monotonic()
        outputs = await collect(engine, "Once upon a time", params)
        return outputs, time.monotonic() - start

    try:
        outputs, elapsed = asyncio.run(scenario())
    finally:
        engine.shutdown()
    # Every token arrives, one output each, in order, the last finished.
    assert [len(out.outputs[0].token_ids) for out in outputs] == list(range(1, 301))
    assert outputs[-1].finished
    assert wake_ups[0] == 1  # the first token did not wait for company
    assert sum(wake_ups) == 300
    assert len(wake_ups) < 150, wake_ups  # tiny steps: not a wake-up a token
    assert len(wake_ups) <= elapsed * 60 + 3, (len(wake_ups), elapsed)


@pytest.mark.slow
def test_same_seed_gives_the_same_text_at_temperature_0_8(engine):
    def sampled(seed: int) -> SamplingParams:
        return SamplingParams(temperature=0.8, seed=seed, max_tokens=16, ignore_eos=True)

    async def scenario() -> list[str]:
        # Two seeded requests batched together, then one alone: batching must not matter.
        together = await asyncio.gather(*(collect(engine, "Once upon a time", sampled(s))
                                          for s in (1234, 1234, 99)))
        alone = await collect(engine, "Once upon a time", sampled(1234))
        return [outs[-1].outputs[0].text for outs in [*together, alone]]

    first, second, other_seed, alone = asyncio.run(scenario())
    assert first == second == alone
    assert other_seed != first


@pytest.mark.parametrize("prompt", ["", []])
def test_bad_request_fails_its_own_stream_and_the_engine_keeps_serving(engine, prompt):
    with pytest.raises(ValueError, match="empty"):
        run(engine, prompt, SamplingParams(max_tokens=2))
    outputs = run(engine, "Hello", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert outputs[-1].outputs[0].finish_reason == "length"


def test_duplicate_request_id_fails_the_new_stream_only(engine):
    async def scenario() -> tuple[RequestOutput, str]:
        live = engine.stream("Once upon a time", SamplingParams(
            temperature=0, max_tokens=24, ignore_eos=True), request_id="twice")
        await anext(live)  # the first request is running now
        with pytest.raises(ValueError, match="already running") as error:
            await collect(engine, "Hello", SamplingParams(max_tokens=2), request_id="twice")
        return [out async for out in live][-1], str(error.value)

    final, message = asyncio.run(scenario())
    assert "'twice'" in message
    assert final.outputs[0].finish_reason == "length"
    assert len(final.outputs[0].token_ids) == 24


def test_llm_generate_stops_at_a_stop_token_id_and_keeps_it(llm):
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    full = llm.generate("The capital of France is", greedy)[0].outputs[0].token_ids
    stop_id = full[5]
    cut = full.index(stop_id) + 1
    out = llm.generate("The capital of France is", SamplingParams(
        temperature=0, max_tokens=16, ignore_eos=True, stop_token_ids=[stop_id]))[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full[:cut]
    assert out.text == llm.tokenizer.decode(full[:cut])


def test_llm_generate_stops_at_max_tokens_with_length(llm):
    out = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=5,
                                                          ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 5


def test_async_engine_is_what_the_server_serves(engine):
    from pagoda.engine.server.served import EngineBackend

    for name in ("stream", "abort", "stats", "check_health"):
        assert callable(getattr(engine, name))
    assert isinstance(engine, EngineBackend)


def test_a_chat_is_tokenized_off_the_callers_event_loop(engine, monkeypatch):
    threads = note_encoding_threads(engine.chat_tokenizer, monkeypatch)
    messages = [{"role": "user", "content": "Hi"}]
    outputs = run(engine, messages, SamplingParams(temperature=0, max_tokens=1))
    assert threads and threading.main_thread().name not in threads
    assert outputs[-1].prompt_token_ids == encode_chat(engine.tokenizer, messages)
