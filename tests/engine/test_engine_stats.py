"""The engine's own figures, as the window's status bar and the server's metrics show them."""

import pytest


def test_generation_throughput_counts_the_last_ten_seconds_of_tokens(make_engine, monkeypatch):
    engine = make_engine(num_kv_blocks=16)
    clock = iter([100.0, 101.0, 102.0, 111.5])
    monkeypatch.setattr("pagoda.engine.llm_engine.time.monotonic", lambda: next(clock))
    assert engine.stats().generation_tokens_per_s == 0.0
    for n in (5, 3, 4):
        engine._record_tokens(n)
    # Tokens after the first time, over the span: (3 + 4) / 2 s.
    assert engine.stats().generation_tokens_per_s == pytest.approx(3.5)
    engine._record_tokens(6)  # at 111.5 s: the first two fall out of the window
    assert engine.stats().generation_tokens_per_s == pytest.approx(6 / 9.5)
