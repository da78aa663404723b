"""/metrics counts every request that ends: finished, left by its client, or failed."""

import contextlib
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pagoda.engine.errors import EngineDeadError
from pagoda.engine.server.served import ServedModel
from tests.engine.server.conftest import MODEL

LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1500, "stream": True,
        "ignore_eos": True, "temperature": 0}


def counters(url: str) -> dict[tuple[str, str], float]:
    """Each sample of /metrics by (name, finish_reason label or "")."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {(sample.name, sample.labels.get("finish_reason", "")): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def moved(before: dict, after: dict, name: str, reason: str = "") -> float:
    return after.get((name, reason), 0.0) - before.get((name, reason), 0.0)


def wait_for(url: str, before: dict, name: str, reason: str, count: float,
             timeout: float = 10.0) -> dict:
    """/metrics once `name{finish_reason=reason}` moved by `count` (the server counts a request
    left by its client when it notices the disconnect)."""
    deadline = time.monotonic() + timeout
    while True:
        after = counters(url)
        if moved(before, after, name, reason) >= count or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def test_tokens_of_streams_closed_by_their_clients_are_counted(server):
    before = counters(server.url)
    received = 0
    with httpx.Client(timeout=60) as http:
        for _ in range(4):
            with http.stream("POST", f"{server.url}/v1/completions", json=LONG) as response:
                chunks = (line for line in response.iter_lines() if line.startswith("data: "))
                for _ in range(3):
                    next(chunks)
                    received += 1  # each chunk of text holds one token or more
    after = wait_for(server.url, before, "pagoda_request_success_total", "abort", 4)
    assert moved(before, after, "pagoda_request_success_total", "abort") == 4
    assert moved(before, after, "pagoda_generation_tokens_total") >= received
    assert moved(before, after, "pagoda_prompt_tokens_total") >= 4 * 4  # "Once upon a time"


class DiesMidReply:
    """The real engine, whose streams fail after `outputs` outputs as if its thread had died."""

    def __init__(self, engine, outputs: int) -> None:
        self._engine = engine
        self._outputs = outputs
        self.last = None

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def stream(self, prompt, params=None, request_id=None, images=()):
        async with contextlib.aclosing(self._engine.stream(prompt, params, request_id,
                                                           images=images)) as outs:
            count = 0
            async for out in outs:
                self.last = out
                yield out
                count += 1
                if count == self._outputs:
                    raise EngineDeadError("the engine thread died: injected by the test")


def test_tokens_of_a_request_the_engine_failed_are_counted(start_server, async_engine):
    backend = DiesMidReply(async_engine, outputs=5)
    server = start_server(source=lambda: ServedModel(MODEL, backend, 2048))
    before = counters(server.url)
    with httpx.stream("POST", f"{server.url}/v1/completions", json=LONG, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert '"error"' in lines[-2] and lines[-1] == "data: [DONE]"
    after = counters(server.url)
    assert moved(before, after, "pagoda_request_success_total", "error") == 1
    assert moved(before, after, "pagoda_generation_tokens_total") == \
        len(backend.last.outputs[0].token_ids) >= 5
    assert moved(before, after, "pagoda_prompt_tokens_total") == \
        len(backend.last.prompt_token_ids)
