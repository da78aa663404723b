"""A list of calls (tool_choice "required") ends where the model writes a call it wrote before:
the calls before it are kept whole, and no part of the repeat is passed on."""

from __future__ import annotations

import json

import pytest

from pagoda.engine.parsers.repeated_calls import RepeatedCallGuard

PARIS = '{\n  "name": "get_weather",\n  "parameters": {"city": "Paris"}\n}'
ROME = '{\n  "name": "get_weather",\n  "parameters": {"city": "Rome"}\n}'
BRACES = '{"name": "note", "parameters": {"text": "a } and a \\" and a {"}}'


def _streamed(text: str, size: int) -> tuple[str, RepeatedCallGuard]:
    guard = RepeatedCallGuard()
    passed = "".join(guard.feed(text[i:i + size]) for i in range(0, len(text), size))
    return passed + guard.flush(), guard


def test_a_call_written_again_ends_the_list_after_the_first():
    guard = RepeatedCallGuard()
    assert json.loads(guard.cut(f"[{PARIS},\n{PARIS},\n{PARIS},\n" + PARIS[:5])) == [json.loads(PARIS)]
    assert guard.repeated


def test_distinct_calls_pass_whole():
    text = f"[{PARIS},\n{ROME}\n]"
    guard = RepeatedCallGuard()
    assert guard.cut(text) == text and not guard.repeated


def test_the_repeat_of_any_earlier_call_ends_the_list():
    cut = RepeatedCallGuard().cut(f"[{PARIS}, {ROME}, {PARIS}, {ROME}]")
    assert json.loads(cut) == [json.loads(PARIS), json.loads(ROME)]


def test_a_call_that_only_begins_like_an_earlier_one_is_sent_once_it_differs():
    text = f"[{PARIS}, {ROME}]"
    guard = RepeatedCallGuard()
    head = guard.feed(text[:len(PARIS) + 1 + 30])  # the second call, as far as "get_weather"
    assert head == "[" + PARIS
    rest = guard.feed(text[len(head) + 30:])
    assert head + rest == text


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 1000])
def test_deltas_of_any_size_pass_what_the_whole_text_passes(size):
    for text in (f"[{PARIS},\n{PARIS},\n{PARIS}", f"[{PARIS}, {ROME}]", f"[{BRACES}, {BRACES}]",
                 f"[{PARIS}, {ROME}, " + PARIS[:9]):
        passed, guard = _streamed(text, size)
        assert passed == RepeatedCallGuard().cut(text)


def test_no_part_of_a_repeat_is_passed_on():
    text = f"[{PARIS},\n{PARIS}"
    guard = RepeatedCallGuard()
    passed = [guard.feed(char) for char in text]
    assert "".join(passed) == f"[{PARIS}]"
    assert passed[-1] == "]" and not any(passed[len(PARIS) + 1:-1])


def test_braces_and_quotes_inside_strings_do_not_end_a_call():
    cut = RepeatedCallGuard().cut(f"[{BRACES}, {BRACES}, {BRACES}]")
    assert json.loads(cut) == [json.loads(BRACES)]


def test_a_reply_cut_short_keeps_what_it_wrote():
    text = f"[{PARIS},\n{PARIS[:12]}"
    guard = RepeatedCallGuard()
    assert guard.cut(text) == text and not guard.repeated
