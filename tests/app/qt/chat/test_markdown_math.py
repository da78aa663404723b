"""Math and the rest of Markdown in the transcript: formulas drawn, quotes barred, code unspaced."""

from __future__ import annotations

from datetime import datetime

import pytest
from PySide6.QtCore import QPoint, Qt, QUrl
from PySide6.QtGui import QColor, QImage, QPalette, QTextBlock, QTextDocument, QTextFormat
from PySide6.QtWidgets import QTextBrowser

from pagoda.app.components.shared.view_models import MessageView
from pagoda.app.qt.chat.markdown import math_insert
from pagoda.app.qt.chat.markdown.markdown_math import Formula, hide_math, split_math
from pagoda.app.qt.chat.markdown.markdown_render import split_fenced_code
from pagoda.app.qt.chat.markdown.math_render import MAX_SOURCE_CHARS, MathLook, render_math
from pagoda.app.qt.chat.markdown.quote_bars import QUOTE_INDENT, quote_bars
from pagoda.app.qt.chat.transcript import TranscriptView

NOW = datetime(2026, 11, 29, 14, 3)
DARK = {QPalette.ColorRole.Base: "#1e1e1e", QPalette.ColorRole.Text: "#e0e0e0",
        QPalette.ColorRole.Window: "#1e1e1e", QPalette.ColorRole.WindowText: "#e0e0e0"}


def inline(source: str, written: str) -> Formula:
    return Formula(source, written, display=False)


def display(source: str, written: str) -> Formula:
    return Formula(source, written, display=True)


@pytest.mark.parametrize(("text", "pieces"), [
    ("so $x^2$ grows", ["so ", inline("x^2", "$x^2$"), " grows"]),
    ("see\n$$\na\\,b\n$$\nabove", ["see\n", display("a\\,b", "$$\na\\,b\n$$"), "\nabove"]),
    ("\\(a+b\\) then \\[c\\]", [inline("a+b", "\\(a+b\\)"), " then ", display("c", "\\[c\\]")]),
    ("\\[\na \\\\ b\n\\]", [display("a \\\\ b", "\\[\na \\\\ b\n\\]")]),
    ("costs $5 and $10.", ["costs $5 and $10."]),
    ("from $5/$10 a month", ["from $5/$10 a month"]),
    ("a $ 5 $ gap", ["a $ 5 $ gap"]),
    ("\\$x\\$ and \\$5", ["\\$x\\$ and \\$5"]),
    ("$\\$5$", [inline("\\$5", "$\\$5$")]),
    ("`$x$` and ``a $y$ b``", ["`$x$` and ``a $y$ b``"]),
    ("an open `$x$ tick", ["an open `", inline("x", "$x$"), " tick"]),
    ("ends with $$x^2", ["ends with $$x^2"]),
    ("$$a\n\nb$$", ["$$a\n\nb$$"]),
    ("$a\nb$", ["$a\nb$"]),
    ("$$ $$ and $ $", ["$$ $$ and $ $"]),
])
def test_math_is_found_by_its_delimiters_and_dollar_amounts_stay_text(text, pieces):
    assert split_math(text) == pieces


def test_fenced_code_is_never_math():
    prose = [segment.text for segment in split_fenced_code("```sh\necho $HOME$\n```\n$x$")
             if not segment.is_code]

    assert [split_math(text) for text in prose] == [[inline("x", "$x$")]]


def test_each_formula_leaves_its_own_placeholder_that_the_text_cannot_hold():
    hidden = hide_math("\ue000 $x$ and $x$")

    assert hidden.formulas == (inline("x", "$x$"), inline("x", "$x$"))
    assert hidden.markdown == f"\ue000 {hidden.placeholder(0)} and {hidden.placeholder(1)}"
    assert "\ue000" not in hidden.marks


# -- rendered in the transcript ------------------------------------------------------------------


def show(view: TranscriptView, content: str) -> QTextDocument:
    view.set_messages([MessageView(1, "assistant", content, NOW)])
    return view.findChild(QTextBrowser).document()


def blocks(document: QTextDocument) -> list[QTextBlock]:
    found, block = [], document.begin()
    while block.isValid():
        found.append(block)
        block = block.next()
    return found


def images(document: QTextDocument) -> list[QImage]:
    """The formula images in the document, in order."""
    drawn = []
    for block in blocks(document):
        fragments = block.begin()
        while not fragments.atEnd():
            fmt = fragments.fragment().charFormat()
            if fmt.isImageFormat():
                name = QUrl(fmt.toImageFormat().name())
                drawn.append(document.resource(QTextDocument.ResourceType.ImageResource, name))
            fragments += 1
    return drawn


def inked(image: QImage) -> list[QColor]:
    return [image.pixelColor(x, y) for y in range(image.height()) for x in range(image.width())
            if image.pixelColor(x, y).alpha() > 200]


def test_a_finished_reply_draws_its_formulas_and_keeps_the_text_around_them(view):
    document = show(view, "Euler: $e^{i\\pi} + 1 = 0$, and\n$$\\int_0^1 x\\,dx$$\nso \\(x\\).")

    drawn = images(document)
    assert len(drawn) == 3 and all(isinstance(image, QImage) and inked(image) for image in drawn)
    text = view.plain_text()
    assert "Euler: \ufffc, and\n\ufffc\nso \ufffc." in text
    assert "$" not in text and "\\" not in text


def test_a_streaming_reply_shows_its_math_as_written_until_it_finishes(view):
    view.begin_stream(MessageView(1, "assistant", "", NOW, status="streaming"))
    view.append_delta(1, "so $x^2$")

    assert "so $x^2$" in view.plain_text()
    assert images(view.findChild(QTextBrowser).document()) == []


def test_backslashes_inside_math_reach_the_renderer_untouched(view, monkeypatch):
    sources = []
    monkeypatch.setattr(math_insert, "render_math", lambda source, look: sources.append(source))

    show(view, "$a\\,b$ and \\[\\{x\\}\\_1\\]")

    assert sources == ["a\\,b", "\\{x\\}\\_1"]


def test_a_formula_that_does_not_parse_is_shown_as_written_in_monospace(view):
    document = show(view, "Bad: $\\frac{a$ and good: $b$")

    assert "Bad: $\\frac{a$ and good: \ufffc" in view.plain_text()
    written = document.find("$\\frac{a$")
    assert written.charFormat().fontFixedPitch()


def test_an_overlong_formula_is_shown_as_written():
    look = MathLook("#000000", 16, display=False)

    assert render_math("x+" * (MAX_SOURCE_CHARS // 2) + "x", look) is None
    assert render_math("x+" * 10 + "x", look) is not None


def test_formulas_take_the_text_colour_of_a_dark_palette(view):
    palette = QPalette()
    for role, color in DARK.items():
        palette.setColor(role, QColor(color))
    view.setPalette(palette)

    ink = inked(images(show(view, "$\\sum_{n=1}^{N} n^2$"))[0])

    assert ink and all(color.lightnessF() > 0.6 for color in ink)


def test_formulas_are_dark_on_a_light_palette(view):
    palette = QPalette()
    palette.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    palette.setColor(QPalette.ColorRole.Text, QColor("#202020"))
    view.setPalette(palette)

    ink = inked(images(show(view, "$\\sum_{n=1}^{N} n^2$"))[0])

    assert ink and all(color.lightnessF() < 0.4 for color in ink)


def test_an_inline_formula_sits_on_the_baseline_without_deepening_the_line(view):
    document = show(view, "plain line\n\nwith $a^2$ in it")
    document.documentLayout().documentSize()

    plain, mixed = (document.findBlock(document.find(word).position()).layout().lineAt(0)
                    for word in ("plain", "with"))

    assert mixed.descent() == pytest.approx(plain.descent(), abs=0.5)


def test_a_display_formula_is_centred_on_a_block_of_its_own(view):
    document = show(view, "Before $$x = y$$ after")

    texts = [block.text() for block in blocks(document)]
    assert texts[2:5] == ["Before", "\ufffc", "after"]
    formula = blocks(document)[3]
    assert formula.blockFormat().alignment() & Qt.AlignmentFlag.AlignHCenter


def test_a_display_formula_in_a_list_item_adds_no_item(view):
    document = show(view, "- one\n- two: $$x$$ and more")

    item = document.findBlock(document.find("one").position())
    assert item.textList().count() == 2


def test_a_formula_in_a_heading_is_drawn_larger(view):
    document = show(view, "# Title $x$\n\nText $x$")

    heading, text = images(document)
    assert heading.height() > text.height()


def test_a_quote_is_muted_indented_and_barred(view, qtbot):
    document = show(view, "Before\n\n> quoted words and a [link](https://example.org)\n\nAfter")
    qtbot.waitExposed(view)

    quote = document.findBlock(document.find("quoted").position())
    assert quote.blockFormat().intProperty(QTextFormat.Property.BlockQuoteLevel) == 1
    assert quote.blockFormat().leftMargin() == QUOTE_INDENT
    assert document.find("quoted").charFormat().foreground().color() == view._colors.muted
    assert document.find("link").charFormat().foreground().color() != view._colors.muted
    bars = quote_bars(document.begin(), 10_000)
    assert len(bars) == 1
    browser = view.findChild(QTextBrowser)
    center = bars[0].center().toPoint() - QPoint(0, browser.verticalScrollBar().value())
    grabbed = view.grab().toImage()
    pixel = grabbed.pixelColor(browser.viewport().mapTo(view, center) * grabbed.devicePixelRatio())
    bar = view._colors.quote_bar
    assert max(abs(pixel.red() - bar.red()), abs(pixel.blue() - bar.blue())) <= 1


def test_a_nested_quote_has_a_bar_per_level(view):
    document = show(view, "> outer\n>\n> > inner")

    inner = document.findBlock(document.find("inner").position())
    assert len(quote_bars(inner, 10_000)) >= 2


def test_text_right_after_a_code_block_follows_it_without_an_empty_line(view):
    document = show(view, "```\nx = 1\n```\n\nAfter the code\n\n```\ny\n```\n- a list\n")

    texts = [block.text() for block in blocks(document)]
    assert texts[texts.index("x = 1") + 1] == "After the code"
    assert texts[texts.index("y") + 1] == "a list"


def test_a_reply_that_opens_with_a_list_has_no_empty_line_above_it(view):
    document = show(view, "- first\n- second")

    texts = [block.text() for block in blocks(document)]
    assert texts[texts.index("first") - 1].startswith("Assistant")
