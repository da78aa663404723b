"""A chat's automatic title reads as text: math in the first message becomes plain text (no
view renders TeX in a title), and what only looks like math is left alone."""

from __future__ import annotations

import pytest

from pagoda.app.store import ConversationStore
from pagoda.app.store.plain_math import plain_math
from pagoda.app.store.titles import auto_title


def test_math_in_the_first_message_is_plain_text_in_the_title(store: ConversationStore) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, r"What is $\frac{a}{b}$ when $x^2 = 4$?")
    assert store.get_conversation(cid).title == "What is a/b when x² = 4?"


@pytest.mark.parametrize(("tex", "plain"), [
    (r"$\frac{a+1}{2b}$", "(a+1)/2b"),
    (r"$$\int_0^1 x^{n+1}\,dx$$", "∫₀¹ xⁿ⁺¹ dx"),
    (r"\(\sqrt{x+1} \leq \alpha_i\)", "√(x+1) ≤ αᵢ"),
    (r"\[\sum_{k=1}^{n} k = \frac{n(n+1)}{2}\]", "∑ₖ₌₁ⁿ k = (n(n+1))/2"),
    (r"$\mathbb{R}^n \to \mathbb{R}$", "ℝⁿ → ℝ"),
    (r"$\left( \frac{1}{2} \right)^{2}$", "(1/2)²"),
    (r"$\text{speed} = \frac{d}{t}$", "speed = d/t"),
    (r"$\sin\theta \cdot e^{i\pi}$", "sin θ · e^(iπ)"),
    (r"$\sqrt[3]{8}$", "³√8"),
])
def test_tex_reads_as_plain_text(tex, plain):
    assert plain_math(tex) == plain


@pytest.mark.parametrize("text", [
    "Is $5 too much for $10?",
    "Costs $ 5 and $ 6",
    r"A lone \$ sign and C:\path\to",
])
def test_what_only_looks_like_math_is_left_alone(text):
    assert plain_math(text) == text


def test_display_math_on_its_own_lines_titles_with_its_content():
    assert auto_title("$$\n\\int_0^1 x\\,dx\n$$\nWhat is it?") == "∫₀¹ x dx"


def test_math_nested_past_reading_depth_is_bounded_not_an_error():
    deep = "$" + "{" * 5000 + "x" + "}" * 5000 + "$"
    title = auto_title(deep)
    assert title is not None and len(title) <= 120
    assert plain_math("$" + "^" * 3000 + "x$")  # no RecursionError
