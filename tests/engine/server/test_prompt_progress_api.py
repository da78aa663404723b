"""`return_progress` (llama.cpp's field): a streamed reply to a long prompt first sends empty
chunks that say how much of the prompt is read, in llama.cpp's `prompt_progress` shape."""

import json

import httpx
import pytest

from tests.engine.server.conftest import ENGINE, MODEL

CHUNK = 32
LONG = "Read this twice. " * 40  # about 200 tokens: several chunks of 32


@pytest.fixture(scope="module")
def chunked_server(start_server, make_engine):
    from pagoda.engine.async_engine import AsyncEngine
    from pagoda.engine.server.served import ServedModel

    engine = AsyncEngine(engine=make_engine(**ENGINE, max_num_batched_tokens=CHUNK))
    yield start_server(source=lambda: ServedModel(MODEL, engine, 2048))
    engine.shutdown()


def stream_events(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server.url}/v1/{path}", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def chat_body(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "stream": True,
            "max_tokens": 4, "temperature": 0, **extra}


def test_a_long_chat_prompt_streams_its_progress_before_the_reply(chunked_server):
    events = stream_events(chunked_server, "chat/completions", chat_body(return_progress=True))

    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert len(progress) >= 3
    total = progress[0]["total"]
    assert all(p["total"] == total and p["cache"] <= p["processed"] < total for p in progress)
    assert [p["processed"] for p in progress] == sorted({p["processed"] for p in progress})
    first_text = next(i for i, e in enumerate(events)
                      if e["choices"] and e["choices"][0]["delta"].get("content"))
    assert all("prompt_progress" not in e for e in events[first_text:])
    for event in events:
        if "prompt_progress" in event:
            assert event["choices"] == [{"index": 0, "delta": {}, "finish_reason": None,
                                         "logprobs": None}]


def test_progress_is_sent_only_when_asked_for(chunked_server):
    events = stream_events(chunked_server, "chat/completions", chat_body())

    assert not any("prompt_progress" in e for e in events)


def test_a_completion_streams_progress_as_empty_text(chunked_server):
    body = {"model": MODEL, "prompt": LONG, "stream": True, "max_tokens": 2,
            "temperature": 0, "return_progress": True}
    events = stream_events(chunked_server, "completions", body)

    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["choices"][0]["text"] == "" for e in progress)
