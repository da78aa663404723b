"""Reasoning between <think> and </think> is split from the answer, whole and streamed, whether
the reply opens the reasoning itself or the prompt already did."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.engine.parsers.reasoning import (
    ReasoningParser,
    prompt_opens_reasoning,
    reasoning_parser_for_template,
)
from tests.engine.parsers.streaming import cuts_of, pieces

parser = ReasoningParser()

QWEN3 = "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nIt is **4**."
R1_AFTER_OPEN_PROMPT = "Okay, 2+2 is 4 — simple.\n</think>\n\nThe answer is 4."
CUT_MID_THINKING = "<think>\nLet me list the primes: 2, 3, 5, 7, 11, 1"


def test_reasoning_and_answer_are_split_at_the_end_tag():
    assert parser.split(QWEN3, starts_in_reasoning=False) == (
        "\nThe user wants 2+2. That is 4.\n", "It is **4**.")


def test_reply_after_a_prompt_that_opened_reasoning_starts_inside_it():
    assert parser.split(R1_AFTER_OPEN_PROMPT, starts_in_reasoning=True) == (
        "Okay, 2+2 is 4 — simple.\n", "The answer is 4.")


def test_reply_cut_before_the_end_tag_is_all_reasoning():
    assert parser.split(CUT_MID_THINKING, starts_in_reasoning=False) == (
        "\nLet me list the primes: 2, 3, 5, 7, 11, 1", "")


def test_reply_without_reasoning_is_all_content():
    text = "  Paris is the capital of France."
    assert parser.split(text, starts_in_reasoning=False) == (None, text)


def test_start_tag_after_the_beginning_is_content():
    text = "Models write <think> to reason.</think> Like that."
    assert parser.split(text, starts_in_reasoning=False) == (None, text)


def test_start_tag_after_leading_whitespace_opens_reasoning():
    assert parser.split("\n <think>a</think>b", starts_in_reasoning=False) == ("a", "b")


def test_empty_reasoning_is_empty_not_none():
    assert parser.split("<think>\n\n</think>\n\nHi", starts_in_reasoning=False) == ("\n\n", "Hi")


def test_parser_takes_other_tags():
    other = ReasoningParser("<reasoning>", "</reasoning>")
    assert other.split("<reasoning>r</reasoning> c", starts_in_reasoning=False) == ("r", "c")


def stream(text: str, chunks: list[str], starts_in_reasoning: bool) -> tuple[str, str]:
    streamer = parser.streamer(starts_in_reasoning)
    parts = [*(streamer.feed(chunk) for chunk in chunks), streamer.finish()]
    return "".join(r for r, _ in parts), "".join(c for _, c in parts)


CASES = [(QWEN3, False), (R1_AFTER_OPEN_PROMPT, True), (CUT_MID_THINKING, False),
         ("  Paris.", False), ("Models write <think> too.", False), ("<thin", False),
         ("<think>a</thin", False), ("x</think>\n", True), ("   ", False)]


@pytest.mark.parametrize(("text", "starts_in_reasoning"), CASES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_split_streams_what_split_gives(text, starts_in_reasoning, data):
    chunks = pieces(text, data.draw(cuts_of(text)))
    reasoning, content = parser.split(text, starts_in_reasoning=starts_in_reasoning)
    assert stream(text, chunks, starts_in_reasoning) == (reasoning or "", content)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(["<think>", "</think>", "<th", "</", ">", "a", " ", "\n",
                                       "é"]), max_size=20),
       starts_in_reasoning=st.booleans(), data=st.data())
def test_any_reply_streams_what_split_gives(parts, starts_in_reasoning, data):
    text = "".join(parts)
    chunks = pieces(text, data.draw(cuts_of(text)))
    reasoning, content = parser.split(text, starts_in_reasoning=starts_in_reasoning)
    assert stream(text, chunks, starts_in_reasoning) == (reasoning or "", content)


def test_reasoning_streams_before_its_end_and_holds_only_a_possible_tag():
    streamer = parser.streamer(False)
    assert streamer.feed("<think>Let me see</th") == ("Let me see", "")
    assert streamer.feed("ink>\n\nYes") == ("", "Yes")


def test_template_with_both_tags_gets_a_reasoning_parser():
    qwen3 = "{%- if enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}"
    assert reasoning_parser_for_template(qwen3) == ReasoningParser()
    assert reasoning_parser_for_template("<|im_start|>assistant\n") is None
    assert reasoning_parser_for_template("only <think> here") is None


@pytest.mark.parametrize(("prompt", "opens"), [
    ("<｜User｜>2+2?<｜Assistant｜><think>\n", True),
    ("<|im_start|>assistant\n<think>  \n\n", True),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
    ("<|im_start|>assistant\n", False),
])
def test_prompt_ending_in_an_open_start_tag_opens_reasoning(prompt, opens):
    assert prompt_opens_reasoning(prompt, parser) is opens
