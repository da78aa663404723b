"""Continuing a reply cut at its max tokens (vLLM's continue_final_message): the engine here and
Pagoda's server go on from the reply's text; servers that cannot are refused before anything is
sent, with the reason in words."""

import pytest
from conftest import remote, run

from pagoda.app.backends import ChatMessage, InvalidRequestError, SamplingOptions

QUESTION = [ChatMessage("user", "Name three colours.")]
SHORT = SamplingOptions(temperature=0.0, max_tokens=4)
MORE = SamplingOptions(temperature=0.0, max_tokens=12)


async def _collect(backend, messages, options, **kwargs):
    return [c async for c in backend.stream(messages, options, **kwargs)]


def _continued(backend):
    cut = run(_collect(backend, QUESTION, SHORT))[-1]
    assert cut.finish_reason == "length"
    rest = run(_collect(backend, [*QUESTION, ChatMessage("assistant", cut.text)], MORE,
                        continue_final_message=True))[-1]
    whole = run(_collect(backend, QUESTION, SamplingOptions(temperature=0.0, max_tokens=16)))[-1]
    return cut, rest, whole


def test_the_local_engine_goes_on_where_the_reply_stopped(local_backend):
    cut, rest, whole = _continued(local_backend)
    assert rest.text and not rest.text.startswith(cut.text)  # only what follows
    assert rest.num_prompt_tokens >= cut.num_prompt_tokens + cut.num_output_tokens - 1
    assert whole.text.startswith(cut.text)
    assert (cut.text + rest.text).startswith(whole.text[:len(cut.text) + 1])


def test_pagodas_server_continues_as_the_engine_here_does(local_backend, pagoda_server):
    _, local_rest, _ = _continued(local_backend)
    _, served_rest, _ = _continued(remote(f"{pagoda_server.url}/v1"))
    assert served_rest.text == local_rest.text


def test_vllm_is_asked_to_continue_in_its_own_words(fake_vllm):
    fake, url = fake_vllm
    run(_collect(remote(url), [*QUESTION, ChatMessage("assistant", "Red,")], SHORT,
                 continue_final_message=True))
    body = fake.requests[-1]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": "Red,"}


def test_a_server_that_cannot_continue_is_refused_before_sending(fake_llama_cpp):
    fake, url = fake_llama_cpp
    with pytest.raises(InvalidRequestError, match="cannot continue a reply"):
        run(_collect(remote(url), [*QUESTION, ChatMessage("assistant", "Red,")], SHORT,
                     continue_final_message=True))
    assert not any(r.get("continue_final_message") for r in fake.requests)
