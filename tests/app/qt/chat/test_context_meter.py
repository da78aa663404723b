"""The context meter: usage in words, amber near the limit, red when the next reply may not fit."""

from __future__ import annotations

import pytest

from pagoda.app.qt.chat.context_meter import FULL_MESSAGE, ContextMeter


@pytest.fixture
def meter(qtbot) -> ContextMeter:
    widget = ContextMeter()
    qtbot.addWidget(widget)
    return widget


def test_shows_used_and_total_tokens_with_thousands_separators(meter):
    meter.set_usage(1234, 8192, 512)
    assert meter.label.text() == "1,234 / 8,192 tokens"
    assert (meter.bar.value(), meter.bar.maximum()) == (1234, 8192)
    assert meter.objectName() == "contextMeter"


def test_low_usage_is_ok_with_no_message(meter):
    meter.set_usage(1234, 8192, 512)
    assert meter.state() == "ok"
    assert meter.message() == ""
    assert "512" in meter.toolTip()


def test_eighty_percent_turns_amber(meter):
    meter.set_usage(6554, 8192, 100)
    assert meter.state() == "warn"
    assert meter.message() == "The conversation uses 80% of the model's context."
    assert meter.bar.property("state") == "warn"
    assert meter.toolTip() == meter.message()


def test_just_under_eighty_percent_is_still_ok(meter):
    meter.set_usage(6553, 8192, 100)
    assert meter.state() == "ok"


def test_reply_reserve_beyond_the_context_turns_red_and_explains(meter):
    meter.set_usage(2000, 8192, 7000)
    assert meter.state() == "full"
    assert meter.message() == FULL_MESSAGE
    assert meter.message().startswith("The next reply may not fit")
    assert "they stay in the chat" in meter.toolTip()
    assert meter.label.property("state") == "full"


def test_exactly_filling_the_context_still_fits(meter):
    meter.set_usage(7192, 8192, 1000)
    assert meter.state() == "warn"


def test_going_back_under_the_limit_clears_the_warning(meter):
    meter.set_usage(8000, 8192, 1024)
    meter.set_usage(100, 8192, 1024)
    assert meter.state() == "ok"
    assert meter.message() == ""
    assert meter.bar.property("state") == "ok"


def test_unknown_context_shows_only_the_count(meter):
    meter.set_usage(42, 0, 1024)
    assert meter.label.text() == "42 tokens"
    assert meter.state() == "ok"


def test_usage_beyond_the_context_keeps_the_bar_full(meter):
    meter.set_usage(9000, 8192, 0)
    assert meter.bar.value() == 8192
    assert meter.state() == "full"
