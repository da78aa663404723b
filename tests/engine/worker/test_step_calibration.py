"""The step cost measured where the engine runs: the calibration at load, the refinement from the
engine's own steps, and the cost model deciding drafts without changing a greedy token."""

from __future__ import annotations

from pagoda.engine import SamplingParams
from pagoda.engine.text.chat_template import encode_chat
from pagoda.engine.worker.calibration import CALIBRATION_REPEATS, calibrate_step_cost

COPY = "Repeat this list exactly: apples, pears, plums, figs, dates, limes, kiwis, grapes."
OPEN = "Write a short story about a dragon who learns to bake bread."


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens)


def test_calibration_times_one_to_k_plus_one_rows_and_a_small_batch_in_a_few_steps(
        make_engine, monkeypatch):
    engine = make_engine(num_speculative_tokens=2, num_threads=1)
    steps: list[int] = []
    execute = engine.runner.execute
    monkeypatch.setattr(engine.runner, "execute",
                        lambda sched: (steps.append(sched.num_batched_tokens), execute(sched))[1])

    cost = calibrate_step_cost(engine.runner, 2, 512)

    assert sorted(cost.table()) == [1, 2, 3, 6]
    # One untimed run of the largest shape, then each shape twice: a bounded calibration.
    assert len(steps) == 1 + CALIBRATION_REPEATS * 4
    assert all(seconds > 0 for seconds in cost.table().values())
    assert cost.seconds(6) >= cost.seconds(1)
    assert engine.kv_cache.stats().usage == 0.0  # nothing of it is held or cached


def test_the_engine_calibrates_at_load_and_refines_from_its_decode_steps(make_engine):
    engine = make_engine(num_speculative_tokens=2, num_threads=1)
    calibrated = dict(engine.step_cost.table())
    assert set(calibrated) == {1, 2, 3, 6}

    engine.add_request("r", encode_chat(engine.tokenizer, [{"role": "user", "content": OPEN}]),
                       greedy(8))
    while engine.has_unfinished_requests():
        engine.step()

    assert engine.step_cost.table() != calibrated


def test_without_speculation_nothing_is_calibrated(make_engine):
    assert not make_engine(num_threads=1).step_cost.is_known


def test_greedy_tokens_are_the_same_with_the_cost_model_deciding_the_drafts(make_llm):
    prompts = [[{"role": "user", "content": COPY}], [{"role": "user", "content": OPEN}]]
    off = make_llm(num_threads=1)
    on = make_llm(num_threads=1, num_speculative_tokens=2)
    for messages in prompts:
        want = off.chat(messages, greedy(40)).outputs[0].token_ids
        got = on.chat(messages, greedy(40)).outputs[0].token_ids
        assert got == want
    stats = on.stats()
    assert stats.spec_status.startswith("drafts o")
    assert "-row step costs" in stats.spec_reason and "x a 1-row step here" in stats.spec_reason
