"""Prefill progress: a prompt read in several chunks reports, after each chunk that does not end
it, how many of its tokens are computed, so a long prompt is seen being read."""

import asyncio

import pytest

from pagoda.engine import AsyncEngine, RequestOutput, SamplingParams

CHUNK = 16
ENGINE = {"num_kv_blocks": 64, "num_threads": 1, "max_num_batched_tokens": CHUNK}
PARAMS = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


def long_prompt(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def run_to_end(engine, request_id: str, prompt: list[int]) -> list[RequestOutput]:
    engine.add_request(request_id, prompt, PARAMS)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [out for out in engine.step() if out.request_id == request_id]
    return outputs


@pytest.fixture
def engine(make_engine):
    return make_engine(**ENGINE)


def test_a_chunked_prompt_reports_each_chunk_read_before_its_first_token(engine):
    outputs = run_to_end(engine, "long", long_prompt(70))

    progress = [out.prompt_progress for out in outputs if out.prompt_progress is not None]
    assert [p.num_computed_tokens for p in progress] == [16, 32, 48, 64]
    assert all(p.num_prompt_tokens == 70 and p.num_cached_tokens == 0 for p in progress)
    assert [p.elapsed for p in progress] == sorted(p.elapsed for p in progress)
    first_token = next(i for i, out in enumerate(outputs) if out.outputs[0].token_ids)
    assert all(out.prompt_progress is not None for out in outputs[:first_token])
    assert all(out.prompt_progress is None for out in outputs[first_token:])


def test_progress_outputs_carry_no_tokens_and_do_not_finish(engine):
    outputs = run_to_end(engine, "long", long_prompt(40))

    for out in (o for o in outputs if o.prompt_progress is not None):
        assert not out.finished
        assert out.outputs[0].token_ids == [] and out.outputs[0].delta_text == ""
    assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 3


def test_a_prompt_read_in_one_chunk_reports_no_progress(engine):
    outputs = run_to_end(engine, "short", long_prompt(CHUNK - 1))

    assert all(out.prompt_progress is None for out in outputs)


def test_a_cached_prefix_counts_as_read_from_the_first_report(engine):
    run_to_end(engine, "first", long_prompt(70))
    outputs = run_to_end(engine, "again", long_prompt(70) + long_prompt(40, start=900))

    progress = [out.prompt_progress for out in outputs if out.prompt_progress is not None]
    assert progress, "the new part of the prompt was not read in chunks"
    cached = progress[0].num_cached_tokens
    assert cached >= 64  # the full blocks of the first prompt
    assert progress[0].num_computed_tokens == cached + CHUNK
    assert progress[-1].num_computed_tokens < 110


def test_the_stream_reports_progress_then_the_reply(make_engine):
    engine = AsyncEngine(engine=make_engine(**ENGINE))
    try:
        async def collect():
            return [out async for out in engine.stream(long_prompt(50), PARAMS)]

        outputs = asyncio.run(collect())
    finally:
        engine.shutdown()
    read = [out.prompt_progress.num_computed_tokens for out in outputs if out.prompt_progress]
    assert read == [16, 32, 48]
    assert "".join(out.outputs[0].delta_text for out in outputs) == outputs[-1].outputs[0].text
