"""The reasoning budget's bookkeeping over a reply's tokens: which positions it forces, with tokens
whose text is given piece by piece (the engine over a real model: tests/engine/test_thinking_budget.py)."""

from __future__ import annotations

import pytest

from pagoda.engine.parsers.reasoning_markers import reasoning_markers
from pagoda.engine.sampling.reasoning_budget import ReasoningBudget, ReasoningMarkers
from tests.engine.harmony_chat import HARMONY_TEMPLATE, harmony_tokenizer

THINK = reasoning_markers("{{ '<think>' }}...{{ '</think>' }}")
CLOSING = [900, 901, 902, 903]  # "\n", "</", "think", ">" as a tokenizer might write them


class Pieces:
    """Token ids for pieces of text (or of its UTF-8 bytes), one id per distinct piece."""

    def __init__(self) -> None:
        self.raw: dict[int, bytes] = {900: b"\n", 901: b"</", 902: b"think", 903: b">"}

    def ids(self, *pieces: str | bytes) -> list[int]:
        found = {raw: token for token, raw in self.raw.items()}
        written = [piece.encode() if isinstance(piece, str) else piece for piece in pieces]
        for raw in written:
            found.setdefault(raw, len(self.raw))
            self.raw[found[raw]] = raw
        return [found[raw] for raw in written]


@pytest.fixture
def pieces() -> Pieces:
    return Pieces()


def budget_of(n: int, pieces: Pieces, *, opened: bool = True,
              markers: ReasoningMarkers = THINK) -> ReasoningBudget:
    return ReasoningBudget(n, markers, CLOSING, opened=opened, token_bytes=pieces.raw.__getitem__)


def run(budget: ReasoningBudget, model: list[int]) -> list[int]:
    """The reply written where the model would write `model` (then more of it, in order) and
    the budget forces what it forces; forced positions do not use up the model's tokens."""
    output: list[int] = []
    upcoming = iter(model)
    while True:
        forced = budget.forced_tokens(output, [])[0]
        token = forced if forced is not None else next(upcoming, None)
        if token is None:
            return output
        output.append(token)


def test_reasoning_opened_by_the_prompt_ends_after_exactly_n_tokens_then_the_model_answers(
        pieces):
    thought = pieces.ids(*"abcdefgh")
    answer = pieces.ids("\n\n", "Yes")
    reply = run(budget_of(5, pieces), thought + answer)
    assert reply == thought[:5] + CLOSING + thought[5:] + answer


def test_a_reply_that_closes_its_reasoning_in_time_is_untouched(pieces):
    reply = pieces.ids("a", "b", "\n", "</", "think", ">", "x", "y", "z", "w")
    assert run(budget_of(4, pieces), reply) == reply


def test_a_closing_marker_begun_as_the_budget_runs_out_is_not_cut(pieces):
    # "a b \n" are 3 reasoning tokens; "</" and "think" may be the closing marker, and are.
    reply = pieces.ids("a", "b", "\n", "</", "think", ">", "answer")
    assert run(budget_of(4, pieces), reply) == reply
    assert run(budget_of(2, pieces), reply) == reply[:2] + CLOSING + reply[2:]


def test_text_that_only_looked_like_the_marker_is_counted_once_it_is_not(pieces):
    reply = pieces.ids("a", "</", "b>", "c", "d")
    # "</" waits; "b>" shows it was reasoning: 3 tokens spent, over a budget of 2.
    assert run(budget_of(2, pieces), reply) == reply[:3] + CLOSING + reply[3:]


def test_text_that_keeps_looking_like_the_marker_is_counted_all_the_same(pieces):
    reply = pieces.ids(*"<" * 20)
    cut = run(budget_of(3, pieces), reply)
    # Seven held as a possible "</think>" (its 8 characters less one), then all eight counted.
    assert cut[:8] == reply[:8] and cut[8:12] == CLOSING


def test_a_character_written_in_several_tokens_is_finished_before_the_closing(pieces):
    reply = pieces.ids("a", b"\xe4\xbd", b"\xa0", "b")  # "你" in two tokens
    assert run(budget_of(2, pieces), reply) == reply[:3] + CLOSING + reply[3:]


def test_reasoning_opened_by_the_reply_counts_from_after_its_tag(pieces):
    reply = pieces.ids(" ", "<th", "ink>", "a", "b", "c", "d")
    assert run(budget_of(2, pieces, opened=False), reply) == reply[:5] + CLOSING + reply[5:]


def test_a_reply_that_does_not_open_with_reasoning_is_never_forced(pieces):
    reply = pieces.ids("Hi", " <think>", "a", "b", "c", "d")
    assert run(budget_of(1, pieces, opened=False), reply) == reply


def test_a_budget_of_zero_closes_the_reasoning_at_once(pieces):
    reply = pieces.ids("a", "b")
    assert run(budget_of(0, pieces), reply) == CLOSING + reply


def test_each_draft_position_is_forced_as_if_the_drafts_were_output(pieces):
    budget = budget_of(3, pieces)
    output, drafts = pieces.ids("a", "b"), [*pieces.ids("c"), *CLOSING[:2], *pieces.ids("d")]
    one_by_one = [budget_of(3, pieces).forced_tokens(output + drafts[:j], [])[0]
                  for j in range(len(drafts) + 1)]
    assert budget.forced_tokens(output, drafts) == one_by_one == \
        [None, *CLOSING]  # "d" where "think" is forced: a draft the model will reject
    assert budget.forced_tokens(output + drafts[:1], []) == [CLOSING[0]]  # kept state agrees


def test_harmony_analysis_runs_into_the_final_channel_and_a_later_one_shares_the_budget():
    tokenizer = harmony_tokenizer()
    markers = reasoning_markers(HARMONY_TEMPLATE)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    closing = markers.closing_ids(encode)
    assert tokenizer.decode(closing, skip_special_tokens=False) == \
        "<|end|><|start|>assistant<|channel|>final<|message|>"
    budget = ReasoningBudget(6, markers, closing, opened=False, token_bytes=lambda t:
                             tokenizer.decode([t], skip_special_tokens=False).encode())
    first = encode("<|channel|>analysis<|message|>abcd<|end|><|start|>assistant"
                   "<|channel|>commentary<|message|>ok<|end|><|start|>assistant"
                   "<|channel|>analysis<|message|>")
    reply = run(budget, first + encode("efgh"))
    assert tokenizer.decode(reply, skip_special_tokens=False).endswith(
        "<|channel|>analysis<|message|>ef<|end|><|start|>assistant<|channel|>final<|message|>gh")


def test_reasoning_that_has_just_ended_a_line_is_closed_without_another(pieces):
    reply = pieces.ids("a", "b\n", "c", "d")
    assert run(budget_of(2, pieces), reply) == reply[:2] + CLOSING[1:] + reply[2:]
