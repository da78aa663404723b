"""The OpenAI-compatible API, driven by the official `openai` client, gives what the engine gives."""

import asyncio
import json
import os
import time

import httpx
import openai
import pytest

from pagoda.engine.sampling.params import SamplingParams
from tests.engine.server.conftest import ENGINE, MODEL

CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0, "max_tokens": 24}


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(**ENGINE)


def wait_until_idle(engine, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache_usage == 0.0:
            return
        time.sleep(0.02)
    raise AssertionError(f"the engine is still busy: {engine.stats()}")


def test_models_lists_the_served_model_with_its_context(client, served):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].max_model_len == served.max_model_len


def test_a_model_is_retrieved_by_its_id_and_dated_by_its_file(client, async_engine):
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model"
    assert model.created == int(os.stat(async_engine.engine.loaded.path).st_mtime) > 0
    assert client.models.list().data[0].created == model.created


def test_retrieving_a_model_not_served_is_a_404_naming_it(client):
    with pytest.raises(openai.NotFoundError, match="'no-such-model' does not exist"):
        client.models.retrieve("no-such-model")


def test_greedy_chat_reply_equals_llm_chat(client, llm):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, **GREEDY)
    expected = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=24)).outputs[0]
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.completion_tokens == len(expected.token_ids)


def test_greedy_completion_equals_llm_generate(client, llm):
    prompt = "The capital of France is"
    reply = client.completions.create(model=MODEL, prompt=prompt, **GREEDY)
    expected = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24))[0]
    assert reply.choices[0].text == expected.outputs[0].text
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)


def test_completion_of_token_ids_equals_completion_of_their_text(client, llm):
    ids = llm.tokenizer.encode("Water boils at")
    by_ids = client.completions.create(model=MODEL, prompt=ids, **GREEDY)
    by_text = client.completions.create(model=MODEL, prompt="Water boils at", **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_completions_of_a_batch_of_prompts_come_back_in_order(client):
    prompts = ["One, two,", "Monday, Tuesday,"]
    batch = client.completions.create(model=MODEL, prompt=prompts, **GREEDY)
    alone = [client.completions.create(model=MODEL, prompt=p, **GREEDY).choices[0].text
             for p in prompts]
    assert [c.index for c in batch.choices] == [0, 1]
    assert [c.text for c in batch.choices] == alone


def test_omitted_model_means_the_served_one(client):
    reply = client.completions.with_raw_response.create(model=MODEL, prompt="Hi", max_tokens=2)
    body = json.loads(reply.content)
    assert body["model"] == MODEL


def test_streamed_chat_deltas_join_to_the_whole_reply_with_chinese_intact(client):
    messages = [{"role": "user", "content": "用中文介绍一下北京。"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                           max_tokens=40).choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                 max_tokens=40, stream=True))
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == whole
    assert not any("\ufffd" in d for d in deltas)
    assert any("\u4e00" <= ch <= "\u9fff" for ch in whole)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_streamed_completion_with_usage_ends_with_a_usage_chunk(client):
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].text for c in chunks[:-1])
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", **GREEDY)
    assert text == whole.choices[0].text


def test_llama_cpps_cache_prompt_false_computes_the_whole_prompt_to_the_same_reply(client):
    messages = [{"role": "system", "content": "You answer in one line. " * 12},
                {"role": "user", "content": "Name a colour."}]
    cached = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    again = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    whole = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY,
                                           extra_body={"cache_prompt": False})
    assert again.usage.prompt_tokens_details.cached_tokens >= 64
    assert whole.usage.prompt_tokens_details.cached_tokens == 0
    assert whole.choices[0].message.content == cached.choices[0].message.content


def test_llama_cpps_repeat_penalty_and_n_predict_are_repetition_penalty_and_max_tokens(client):
    ask = {"model": MODEL, "messages": CHAT, "temperature": 0}
    theirs = client.chat.completions.create(
        **ask, extra_body={"repeat_penalty": 1.5, "n_predict": 12})
    ours = client.chat.completions.create(
        **ask, max_tokens=12, extra_body={"repetition_penalty": 1.5})
    plain = client.chat.completions.create(**ask, max_tokens=12)
    assert theirs.usage.completion_tokens == ours.usage.completion_tokens
    assert theirs.choices[0].message.content == ours.choices[0].message.content
    assert ours.choices[0].message.content != plain.choices[0].message.content


@pytest.mark.parametrize(("fields", "param"), [
    ({"repeat_penalty": 1.2, "repetition_penalty": 1.1}, "repeat_penalty"),
    ({"n_predict": 8, "max_tokens": 8}, "n_predict"),
    ({"n_predict": -2}, "n_predict"),
])
def test_a_setting_given_under_both_names_or_out_of_range_is_a_400(client, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=CHAT, extra_body=fields)
    assert refused.value.body["param"] == param


def test_n_predict_minus_one_writes_until_the_reply_ends(client):
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", temperature=0,
                                      extra_body={"n_predict": -1, "stop": ["."]})
    assert reply.usage.completion_tokens > 16  # past the completions endpoint's default
    assert reply.choices[0].finish_reason == "stop"


def test_usage_counts_cached_tokens_when_a_prefix_repeats(client):
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    first = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "Hello!"}], **GREEDY)
    second = client.chat.completions.create(
        model=MODEL, messages=[system, {"role": "user", "content": "Goodbye!"}], **GREEDY)
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= 64
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens


def test_stop_string_ends_the_reply_before_it(client):
    whole = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", **GREEDY)
    text = whole.choices[0].text
    assert " 8" in text, "the test needs a reply that counts on"
    cut = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", stop=[" 8"], **GREEDY)
    assert cut.choices[0].text == text[:text.index(" 8")]
    assert cut.choices[0].finish_reason == "stop"


def test_n_2_gives_two_choices_counted_once_for_the_prompt(client):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, n=2, temperature=1.0,
                                           seed=7, max_tokens=12, extra_body={"ignore_eos": True})
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].message.content != reply.choices[1].message.content
    single = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens
    assert reply.usage.completion_tokens == 2 * 12


def test_same_seed_gives_the_same_sampled_reply(client):
    def sample() -> str:
        return client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0.9,
                                              seed=1234, max_tokens=16).choices[0].message.content
    assert sample() == sample()


def test_vllm_extras_are_applied(client):
    reply = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True, "top_k": 1, "min_p": 0.1,
                                                  "repetition_penalty": 1.2})
    assert reply.usage.completion_tokens == 8


def test_min_tokens_and_typical_p_are_honoured_as_the_engine_honours_them(client, llm):
    short = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0,
                                           max_tokens=200)
    assert short.choices[0].finish_reason == "stop"
    least = short.usage.completion_tokens + 6
    longer = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0,
                                            max_tokens=200, extra_body={"min_tokens": least})
    assert longer.usage.completion_tokens >= least
    typical = {"temperature": 1.0, "seed": 7, "max_tokens": 12}
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, **typical,
                                           extra_body={"typical_p": 0.3})
    expected = llm.chat(CHAT, SamplingParams(**typical, typical_p=0.3)).outputs[0]
    assert reply.choices[0].message.content == expected.text


def test_client_leaving_mid_stream_aborts_its_request_and_frees_its_blocks(server, async_engine):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1500, "stream": True,
            "ignore_eos": True, "temperature": 0}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{server.url}/v1/completions",
                                                       json=body) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    wait_until_idle(async_engine)


def test_client_leaving_a_whole_reply_aborts_its_request(server, async_engine):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1500,
            "ignore_eos": True, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=1.0)
    wait_until_idle(async_engine)


@pytest.mark.slow
def test_32_concurrent_streaming_clients_all_finish(server, async_engine):
    from openai import AsyncOpenAI

    async def run() -> list[str]:
        client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)

        async def one(i: int) -> tuple[str, str | None]:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Count to {i}."}],
                max_tokens=16, temperature=0, stream=True)
            text, reason = "", None
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    reason = chunk.choices[0].finish_reason or reason
            return text, reason

        try:
            return await asyncio.gather(*(one(i) for i in range(32)))
        finally:
            await client.close()

    results = asyncio.run(run())
    assert len(results) == 32
    assert all(text and reason in ("stop", "length") for text, reason in results)
    wait_until_idle(async_engine)


def test_health_and_metrics_report_the_engine(client, server):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "model": MODEL}
    metrics = httpx.get(f"{server.url}/metrics").text
    for name in ("pagoda_num_requests_running", "pagoda_num_requests_waiting",
                 "pagoda_kv_cache_usage_perc", "pagoda_prefix_cache_hit_rate",
                 "pagoda_prompt_tokens_total", "pagoda_generation_tokens_total",
                 "pagoda_time_to_first_token_seconds_bucket",
                 "pagoda_time_per_output_token_seconds_bucket"):
        assert name in metrics


def test_openai_client_raises_on_errors(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=CHAT, temperature=-1)


def test_a_stream_cut_by_an_engine_shutdown_ends_with_abort(start_server, make_engine):
    from pagoda.engine.async_engine import AsyncEngine
    from pagoda.engine.server.served import ServedModel

    engine = AsyncEngine(engine=make_engine(**ENGINE))
    server = start_server(source=lambda: ServedModel(MODEL, engine, 2048))
    body = {"prompt": "Once upon a time", "max_tokens": 1500, "stream": True,
            "ignore_eos": True, "temperature": 0}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        lines = (line for line in response.iter_lines() if line.startswith("data: "))
        next(lines)
        engine.shutdown()  # what a model switch in the app does to the old engine
        rest = list(lines)
    assert rest[-1] == "data: [DONE]"
    last = json.loads(rest[-2][6:])
    assert last["choices"][0]["finish_reason"] == "abort"


def test_tokenize_counts_a_chat_as_the_reply_will_see_it(client, server):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    counted = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "messages": CHAT},
                         timeout=30).json()
    assert counted["count"] == reply.usage.prompt_tokens == len(counted["tokens"])
    assert counted["max_model_len"] > counted["count"]


def test_tokenize_counts_a_text_prompt(server, llm):
    counted = httpx.post(f"{server.url}/tokenize", json={"prompt": "Water boils at"},
                         timeout=30).json()
    assert counted["tokens"] == llm.tokenizer.encode("Water boils at")


@pytest.mark.parametrize("body", [{}, {"prompt": "a", "messages": [{"role": "user",
                                                                   "content": "a"}]}],
                         ids=["neither", "both"])
def test_tokenize_needs_a_prompt_or_a_chat(server, body):
    response = httpx.post(f"{server.url}/tokenize", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt"
