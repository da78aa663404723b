"""A request can never be accepted by an engine that will not run it: streams started while the
engine thread stops, after it stopped, or after it died end at once with EngineDeadError."""

import asyncio
import threading
import time

import pytest

from pagoda.engine import AsyncEngine, EngineDeadError, SamplingParams
from pagoda.engine.async_engine import _STOP

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
# A test that would hang without the fix fails after this instead.
TIMEOUT_S = 20


async def consume(engine: AsyncEngine, prompt: list[int]) -> list:
    return [out async for out in engine.stream(prompt, PARAMS)]


def run_bounded(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S))


@pytest.fixture
def engine(make_engine):
    async_engine = AsyncEngine(engine=make_engine(num_kv_blocks=32))
    yield async_engine
    async_engine.shutdown()


def slow_steps(engine: AsyncEngine, monkeypatch, seconds: float = 0.3) -> threading.Event:
    """Each step sleeps first; the event is set once a step is under way."""
    stepping = threading.Event()
    step = engine.engine.step

    def slowed():
        stepping.set()
        time.sleep(seconds)
        return step()

    monkeypatch.setattr(engine.engine, "step", slowed)
    return stepping


def test_stream_after_shutdown_raises_at_once(engine):
    engine.shutdown()
    with pytest.raises(EngineDeadError):
        run_bounded(consume(engine, [1, 2, 3]))


def test_stream_while_shutdown_waits_on_a_slow_step_raises_at_once(engine, monkeypatch):
    stepping = slow_steps(engine, monkeypatch, seconds=1.0)

    async def scenario():
        first = asyncio.ensure_future(consume(engine, [1, 2, 3]))
        await asyncio.get_running_loop().run_in_executor(None, stepping.wait)
        engine.shutdown(timeout=0)  # returns with the thread still finishing its step
        with pytest.raises(EngineDeadError):
            await consume(engine, [4, 5, 6])
        outputs = await first
        assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "abort"

    run_bounded(scenario())


def test_request_queued_behind_the_threads_last_step_fails_instead_of_hanging(engine,
                                                                               monkeypatch):
    stepping = slow_steps(engine, monkeypatch)

    async def scenario():
        first = asyncio.ensure_future(consume(engine, [1, 2, 3]))
        await asyncio.get_running_loop().run_in_executor(None, stepping.wait)
        engine._inbox.put(_STOP)  # the thread will stop after this step, unannounced
        with pytest.raises(EngineDeadError):
            await consume(engine, [4, 5, 6])
        await first

    run_bounded(scenario())


def test_streams_after_the_engine_thread_died_raise_at_once(engine, monkeypatch):
    def broken_step():
        raise SystemError("a broken step")

    async def scenario():
        monkeypatch.setattr(engine.engine, "step", broken_step)
        with pytest.raises(EngineDeadError):
            await consume(engine, [1, 2, 3])
        with pytest.raises(EngineDeadError):
            await consume(engine, [4, 5, 6])

    run_bounded(scenario())
