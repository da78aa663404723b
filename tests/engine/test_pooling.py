"""A pooling request's vector is the mean of the model's final-normed hidden states over its
prompt, as Hugging Face computes them on the same weights (its LlamaModel's last_hidden_state
is after the final norm): read in chunks, batched with replies, after a preemption, and with
the prompt already in the prefix cache, which it neither reads nor fills."""

import asyncio

import pytest
import torch
import transformers

from pagoda.engine import AsyncEngine, EngineConfig, LLMEngine, PoolingParams, SamplingParams
from pagoda.engine.errors import PromptTooLongError

# Float error of a 2-layer model in fp32, summed over a prompt.
TOLERANCE = 1e-4
# 16-token chunks: a 40-token prompt is read in three steps.
CHUNKED = {"num_kv_blocks": 64, "max_num_batched_tokens": 16, "num_threads": 1}
PROMPTS = [[7], list(range(10, 15)), list(range(100, 140))]


@pytest.fixture(scope="module")
def reference(tiny_model_folder):
    model = transformers.AutoModel.from_pretrained(tiny_model_folder, dtype=torch.float32)
    model.eval()

    @torch.inference_mode()
    def mean_hidden(prompt: list[int]) -> torch.Tensor:
        return model(torch.tensor([prompt])).last_hidden_state[0].mean(dim=0)

    return mean_hidden


@pytest.fixture
def make_tiny_engine(tiny_model_folder):
    return lambda **config: LLMEngine(str(tiny_model_folder), EngineConfig(**config))


def run(engine: LLMEngine, requests: dict) -> dict:
    """Add requests {request_id: (prompt, params)}, step until all end: their final outputs."""
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    finals = {}
    while engine.has_unfinished_requests():
        finals.update((out.request_id, out) for out in engine.step() if out.finished)
    return finals


def raw(prompts: list[list[int]]) -> dict:
    return {f"pool-{i}": (p, PoolingParams(normalize=False)) for i, p in enumerate(prompts)}


def assert_is_reference(out, prompt, reference) -> None:
    assert out.outputs[0].finish_reason == "stop"
    got = torch.tensor(out.embedding)
    want = reference(prompt)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < TOLERANCE


def test_the_vector_is_the_mean_of_the_final_normed_hidden_states(make_tiny_engine, reference):
    """One token (a decode-shaped row), five, and forty read in three chunks, in one batch."""
    finals = run(make_tiny_engine(**CHUNKED), raw(PROMPTS))
    for i, prompt in enumerate(PROMPTS):
        assert_is_reference(finals[f"pool-{i}"], prompt, reference)


def test_a_normalised_vector_has_unit_length_and_the_means_direction(make_tiny_engine,
                                                                   reference):
    finals = run(make_tiny_engine(**CHUNKED), {"unit": (PROMPTS[2], PoolingParams())})
    got = torch.tensor(finals["unit"].embedding)
    assert abs(got.norm().item() - 1.0) < 1e-5
    want = torch.nn.functional.normalize(reference(PROMPTS[2]), dim=0)
    assert (got - want).abs().max().item() < TOLERANCE


def test_a_reply_in_the_same_steps_is_unchanged_and_the_vector_too(make_tiny_engine,
                                                                  reference):
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = list(range(200, 230))
    alone = run(make_tiny_engine(**CHUNKED), {"reply": (prompt, greedy)})["reply"]
    together = run(make_tiny_engine(**CHUNKED), {"reply": (prompt, greedy), **raw(PROMPTS)})
    assert together["reply"].outputs[0].token_ids == alone.outputs[0].token_ids
    assert together["reply"].embedding is None
    for i, p in enumerate(PROMPTS):
        assert_is_reference(together[f"pool-{i}"], p, reference)


def test_a_cached_prompt_is_computed_again_and_nothing_is_cached_for_it(make_tiny_engine,
                                                                       reference):
    engine = make_tiny_engine(**CHUNKED)
    prompt = PROMPTS[2]
    run(engine, {"reply": (prompt, SamplingParams(temperature=0, max_tokens=1))})
    cached = engine.kv_cache.stats()
    assert cached.num_cached_blocks == 2  # the reply left its prompt's full blocks
    out = run(engine, raw([prompt]))["pool-0"]
    assert out.num_cached_tokens == 0
    assert_is_reference(out, prompt, reference)
    after = engine.kv_cache.stats()
    assert after.num_cached_blocks == cached.num_cached_blocks
    assert after.prefix_hit_tokens == cached.prefix_hit_tokens
    assert after.num_free_blocks == after.num_blocks  # every block given back


def test_a_pooling_request_preempted_midway_is_read_again_from_its_start(make_tiny_engine,
                                                                        reference):
    """Six blocks: the reply (2 blocks of prompt, growing) and the 80-token pooling request
    (5 blocks) cannot both fit, so the newer, the pooling one, is preempted."""
    engine = make_tiny_engine(num_kv_blocks=6, max_num_batched_tokens=16, num_threads=1)
    reply = (list(range(300, 330)), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    prompt = list(range(400, 480))
    finals = run(engine, {"reply": reply, **raw([prompt])})
    assert engine.stats().num_preemptions >= 1
    assert len(finals["reply"].outputs[0].token_ids) == 40
    assert_is_reference(finals["pool-0"], prompt, reference)


def test_a_prompt_may_fill_the_whole_context_but_no_more(make_tiny_engine):
    engine = make_tiny_engine(num_kv_blocks=64, num_threads=1, max_model_len=64)
    assert len(run(engine, raw([[5] * 64]))["pool-0"].embedding) == engine.hidden_size
    with pytest.raises(PromptTooLongError, match="65 tokens"):
        engine.add_request("long", [5] * 65, PoolingParams())


def test_embed_gives_the_vectors_in_order_and_a_cancelled_one_leaves_nothing_running(
        tiny_model_folder, reference):
    engine = AsyncEngine(tiny_model_folder, EngineConfig(**CHUNKED))

    async def embed_then_cancel() -> tuple[list[list[float]], bool]:
        vectors = await engine.embed(PROMPTS, PoolingParams(normalize=False))
        # 32,000 tokens: over a second of work where 2,000 took under 50 ms on a Zen 5
        task = asyncio.ensure_future(engine.embed([list(range(500, 1000))] * 64))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return vectors, task.cancelled()

    try:
        vectors, cancelled = asyncio.run(embed_then_cancel())
        assert cancelled, "the long embed finished before it could be cancelled"
        for vector, prompt in zip(vectors, PROMPTS, strict=True):
            assert (torch.tensor(vector) - reference(prompt)).abs().max().item() < TOLERANCE
        deadline = asyncio.run(_settled(engine))
        assert deadline, "the cancelled embed's requests are still in the engine"
    finally:
        engine.shutdown()


async def _settled(engine: AsyncEngine) -> bool:
    for _ in range(100):
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0:
            return True
        await asyncio.sleep(0.05)
    return False
