"""The status bar: engine state in words, figures formatted, and no needless repaints."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QLabel

from pagoda.app.components.shared.view_models import EngineStatusView, LoadStepView, LocalServerView
from pagoda.app.qt.status_bar import SPEC_EXPLAINED, EngineStatusBar

MODEL = "SmolLM2-135M-Instruct"


def ready(**figures) -> EngineStatusView:
    return EngineStatusView(state="ready", device="cpu", model=MODEL, **figures)


@pytest.fixture
def bar(qtbot) -> EngineStatusBar:
    widget = EngineStatusBar()
    qtbot.addWidget(widget)
    return widget


def test_loading_shows_the_model_and_an_indeterminate_progress_bar(bar):
    bar.show_status(EngineStatusView(state="loading", device="cpu", model=MODEL))
    assert bar.summary_text() == "Loading SmolLM2-135M-Instruct…"
    assert bar.is_loading()
    assert (bar.progress.minimum(), bar.progress.maximum()) == (0, 0)
    assert not bar.is_error()


def test_loading_names_its_step_and_how_far_it_has_got(bar):
    bar.show_status(EngineStatusView(state="loading", device="cpu", model=MODEL,
                                     load=LoadStepView("building the model", 5, 6, 0.4)))
    assert bar.summary_text() == ("Loading SmolLM2-135M-Instruct… 73%: building the model "
                                  "(step 5 of 6)")
    assert bar.progress.value() / bar.progress.maximum() == pytest.approx((4 + 0.4) / 6, abs=1e-3)

    bar.show_status(EngineStatusView(state="loading", device="cpu", model=MODEL,
                                     load=LoadStepView("preparing the engine", 6, 6)))
    assert bar.summary_text() == ("Loading SmolLM2-135M-Instruct… 83%: preparing the engine "
                                  "(step 6 of 6)")
    assert bar.progress.value() / bar.progress.maximum() == pytest.approx(5 / 6, abs=1e-3)


def test_ready_shows_device_and_hides_progress(bar):
    bar.show_status(EngineStatusView(state="loading", device="cpu", model=MODEL))
    bar.show_status(ready())
    assert bar.state_label.text() == "Ready · cpu"
    assert not bar.is_loading()
    assert bar.objectName() == "statusBar"


def test_error_shows_the_message_in_red(bar):
    bar.show_status(
        EngineStatusView(state="error", device="cpu", model=MODEL, detail="model file not found")
    )
    assert bar.summary_text() == "Error: model file not found"
    assert bar.is_error()
    assert bar.state_label.property("severity") == "error"
    bar.show()
    color = bar.state_label.palette().color(bar.state_label.foregroundRole())
    assert color.red() > 200 and color.green() < 120
    bar.show_status(ready())
    assert not bar.is_error()


def test_ready_formats_requests_throughput_and_cache_figures(bar):
    bar.show_status(
        ready(
            num_running=3,
            num_waiting=1,
            tokens_per_s=61.234,
            kv_cache_usage=0.123,
            prefix_cache_hit_rate=0.4,
        )
    )
    assert bar.summary_text() == (
        "Ready · cpu | 3 running · 1 waiting | 61.2 tok/s | KV cache 12% | Prefix hits 40%"
    )


def test_speculation_acceptance_shows_only_while_speculating(bar):
    bar.show_status(ready(spec_acceptance_rate=0.634))
    assert bar.summary_text().endswith("Prefix hits 0% | Speed-up: 63% of guesses kept")
    bar.show_status(ready())
    assert "Speed-up" not in bar.summary_text()
    assert bar.spec_label.isHidden()


def test_whether_the_speed_up_is_on_shows_in_plain_words_with_the_reason_in_its_tooltip(bar):
    bar.show_status(ready(spec_acceptance_rate=0.2, spec_status="drafts off: 13% accepted",
                          spec_reason="drafts off: 13% accepted, and a 2-row step costs 1.33x "
                                      "a 1-row step here"))

    assert bar.summary_text().endswith("Prefix hits 0% | Speed-up off")
    assert bar.spec_label.toolTip() == (f"{SPEC_EXPLAINED}\nNow: Drafts off: 13% accepted, and "
                                        "a 2-row step costs 1.33x a 1-row step here.")
    bar.show_status(ready(spec_acceptance_rate=0.6, spec_status="drafts on: 60% accepted",
                          spec_reason="drafts on: 60% accepted; a 3-row step costs 1.10x a "
                                      "1-row step here"))
    assert bar.summary_text().endswith("| Speed-up on")


def test_large_throughput_drops_decimals_and_fractions_are_clamped(bar):
    bar.show_status(ready(tokens_per_s=1234.5, kv_cache_usage=1.7, prefix_cache_hit_rate=-0.2))
    assert "1,234 tok/s" in bar.summary_text()
    assert "KV cache 100%" in bar.summary_text()
    assert "Prefix hits 0%" in bar.summary_text()


def test_figures_are_hidden_while_loading(bar):
    bar.show_status(ready(num_running=2))
    bar.show_status(EngineStatusView(state="loading", device="cuda", model=MODEL))
    assert "running" not in bar.summary_text()
    assert bar.requests_label.isHidden()


def test_unchanged_status_does_not_set_text_again(bar, monkeypatch):
    calls: list[str] = []
    for label in bar.findChildren(QLabel):
        original = label.setText
        monkeypatch.setattr(
            label, "setText", lambda text, _set=original: (calls.append(text), _set(text))
        )
    status = ready(num_running=1, tokens_per_s=40.0)
    bar.show_status(status)
    first = len(calls)
    for _ in range(10):
        bar.show_status(status)
    assert first == 5
    assert len(calls) == first
    bar.show_status(ready(num_running=1, tokens_per_s=41.0))
    assert calls[first:] == ["41.0 tok/s"]


def test_the_local_server_shows_its_address_and_running_api_requests(bar):
    bar.show_status(ready())
    bar.show_server(LocalServerView(port=8000, address="http://127.0.0.1:8000",
                                    running_requests=2))
    assert bar.server_label.text() == "API: http://127.0.0.1:8000 · 2 requests"
    assert bar.summary_text().endswith("| API: http://127.0.0.1:8000 · 2 requests")
    bar.show_server(LocalServerView(port=8000, address="http://127.0.0.1:8000",
                                    running_requests=1))
    assert bar.server_label.text() == "API: http://127.0.0.1:8000 · 1 request"


def test_the_local_server_shows_nothing_while_off(bar):
    bar.show_server(LocalServerView(port=8000, address="http://127.0.0.1:8000"))
    bar.show_server(LocalServerView(port=8000, error="Port 8000 is in use"))
    assert bar.server_label.isHidden()
    assert "API" not in bar.summary_text()


def test_memory_shows_in_megabytes_then_gigabytes_and_says_what_it_counts(bar):
    bar.show_status(ready())
    bar.show_memory(452_300_000)
    assert bar.summary_text().endswith("| Memory 452 MB")
    bar.show_memory(1_849_000_000)
    assert bar.summary_text().endswith("| Memory 1.8 GB")
    assert "resident set" in bar.memory_label.toolTip()


def test_memory_is_hidden_where_it_is_unknown(bar):
    bar.show_memory(300_000_000)
    bar.show_memory(None)
    assert "Memory" not in bar.summary_text() and bar.memory_label.isHidden()
