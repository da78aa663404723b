"""Markdown into a QTextDocument: prose through Qt's own Markdown, fenced code through pygments.

Qt renders prose, lists and tables well but does not highlight code, so a message is split at its
fenced code blocks first. Raw HTML in a message is shown as text (`MarkdownNoHTML`): model output is
never interpreted as markup. Math in the prose is cut out before Qt reads it and drawn afterwards
(markdown_math, math_insert); block quotes are restyled after Qt laid them out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.token import _TokenType
from pygments.util import ClassNotFound
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
)

from pagoda.app.qt.chat.markdown.markdown_math import hide_math
from pagoda.app.qt.chat.markdown.math_insert import insert_formulas
from pagoda.app.qt.chat.markdown.quote_bars import QUOTE_INDENT, quote_level

MARKDOWN_FEATURES = (
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub
    | QTextDocument.MarkdownFeature.MarkdownNoHTML
)
LIGHT_CODE_STYLE = "default"
DARK_CODE_STYLE = "monokai"

LINE_SEPARATOR = "\u2028"

# A line starting like this may open a block (heading, quote, list, rule, setext underline, table)
# or begin with emphasis that a line separator before it would not let open.
_MARKUP_START = re.compile(r"^ {0,3}(?:[#>*+\-_=~`<:|]|\d{1,9}[.)](?:\s|$))")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,9}[.)])\s")
_FENCE_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*)$")


@dataclass(slots=True, frozen=True)
class Segment:
    """A run of a message: prose (language is None) or the body of one fenced code block."""

    text: str
    language: str | None = None

    @property
    def is_code(self) -> bool:
        return self.language is not None


def split_fenced_code(markdown: str) -> list[Segment]:
    """Cut Markdown at its top-level fenced code blocks; an unclosed fence runs to the end."""
    segments: list[Segment] = []
    prose: list[str] = []
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        opening = _match_fence_open(lines[i])
        if opening is None:
            prose.append(lines[i])
            i += 1
            continue
        _flush_prose(prose, segments)
        indent, fence, language = opening
        body, i = _read_fence_body(lines, i + 1, indent, fence)
        segments.append(Segment("\n".join(body), language))
    _flush_prose(prose, segments)
    return segments


def _match_fence_open(line: str) -> tuple[int, str, str] | None:
    match = _FENCE_OPEN.match(line)
    if match is None:
        return None
    fence, info = match["fence"], match["info"].strip()
    if fence[0] == "`" and "`" in info:
        return None  # CommonMark: a backtick fence's info string has no backticks
    language = info.split()[0] if info else ""
    return len(match["indent"]), fence, language


def _read_fence_body(lines: list[str], start: int, indent: int, fence: str) -> tuple[list[str], int]:
    closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
    body: list[str] = []
    i = start
    while i < len(lines) and not closing.match(lines[i]):
        body.append(_strip_indent(lines[i], indent))
        i += 1
    return body, i + 1


def _strip_indent(line: str, indent: int) -> str:
    removable = len(line) - len(line.lstrip(" "))
    return line[min(indent, removable):]


def _flush_prose(prose: list[str], segments: list[Segment]) -> None:
    text = "\n".join(prose)
    if text.strip():
        segments.append(Segment(text))
    prose.clear()


@dataclass(slots=True, frozen=True)
class RenderStyle:
    """What the renderer needs from the palette and screen: code colors, how code-block headers
    and quotes look, the colour of formulas and the pixel ratio they are drawn at."""

    dark: bool
    muted_text: QColor
    link: QColor
    text: QColor
    device_pixel_ratio: float = 1.0


def insert_markdown(
    cursor: QTextCursor, markdown: str, style: RenderStyle, copy_href: Callable[[int], str]
) -> list[str]:
    """Insert `markdown` at `cursor` as new blocks; return the code of each fenced block, in order.

    `copy_href(n)` is the link placed above the n-th code block to copy it.
    """
    codes: list[str] = []
    for segment in split_fenced_code(markdown):
        if segment.is_code:
            _insert_code_block(cursor, segment, style, copy_href(len(codes)))
            codes.append(segment.text)
        else:
            _insert_prose(cursor, segment.text, style)
    return codes


def _insert_prose(cursor: QTextCursor, text: str, style: RenderStyle) -> None:
    hidden = hide_math(_without_blank_edges(text))
    cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
    start = cursor.position()
    cursor.insertMarkdown(_hard_line_breaks(hidden.markdown), MARKDOWN_FEATURES)
    if cursor.position() > start and not cursor.block().text():
        cursor.deletePreviousChar()  # Qt may end the fragment with an empty paragraph
    _drop_empty_first_block(cursor, start)
    _style_quotes(cursor, start, style)
    insert_formulas(cursor, start, hidden, style.text, style.device_pixel_ratio)


def _without_blank_edges(text: str) -> str:
    """`text` less its leading and trailing blank lines: Qt makes a leading one a paragraph."""
    lines = text.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def _drop_empty_first_block(cursor: QTextCursor, start: int) -> None:
    """Remove the block made for the prose when Qt left it empty and began a new one (a list)."""
    first = cursor.document().findBlock(start)
    if first.text() or first.position() + first.length() > cursor.position():
        return
    remover = QTextCursor(cursor.document())
    remover.setPosition(start)
    remover.deletePreviousChar()  # joins the empty block to the one before, which keeps its format


def _style_quotes(cursor: QTextCursor, start: int, style: RenderStyle) -> None:
    """Qt indents a quote 40 px on both sides; ours leave room for a bar (quote_bars) and are muted."""
    block = cursor.document().findBlock(start)
    while block.isValid() and block.position() <= cursor.position():
        if quote_level(block):
            _style_quote(block, style)
        block = block.next()


def _style_quote(block: QTextBlock, style: RenderStyle) -> None:
    line = QTextCursor(block)
    fmt = block.blockFormat()
    fmt.setLeftMargin(quote_level(block) * QUOTE_INDENT)
    fmt.setRightMargin(0)
    line.setBlockFormat(fmt)
    muted = QTextCharFormat()
    muted.setForeground(style.muted_text)
    for position, length in _unlinked_runs(block):  # links keep their colour
        line.setPosition(position)
        line.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
        line.mergeCharFormat(muted)


def _unlinked_runs(block: QTextBlock) -> list[tuple[int, int]]:
    runs = []
    fragments = block.begin()
    while not fragments.atEnd():
        fragment = fragments.fragment()
        if not fragment.charFormat().isAnchor():
            runs.append((fragment.position(), fragment.length()))
        fragments += 1
    return runs


def _hard_line_breaks(text: str) -> str:
    """Keep the model's single newlines as line breaks, as they looked while streaming.

    Between two lines of plain text the newline becomes a line separator (U+2028), which Qt keeps
    inside the paragraph: a Markdown hard break would become a paragraph of its own, spaced like
    any other, and a blank line between two stanzas would no longer stand out. Lines that could
    start or end Markdown syntax get a Markdown hard break instead. Not inside lists: Qt turns a
    hard break in a list item into a new item.
    """
    lines = text.split("\n")
    pieces: list[str] = []
    for line, after in zip(lines, [*lines[1:], None]):
        if after is None:
            pieces.append(line)
        elif not _breaks_after(line, after):
            pieces.append(line + "\n")
        elif _joins_in_paragraph(line, after):
            pieces.append(line.rstrip(" \t") + LINE_SEPARATOR)
        else:
            pieces.append(line + "  \n")
    return "".join(pieces)


def _breaks_after(line: str, after: str) -> bool:
    if not line.strip() or not after.strip():
        return False
    return not (line[0].isspace() or after[0].isspace() or _LIST_ITEM.match(line))


def _joins_in_paragraph(line: str, after: str) -> bool:
    """Both lines are plain paragraph text, so joining them changes no Markdown structure."""
    if _MARKUP_START.match(line) or _MARKUP_START.match(after) or "|" in line + after:
        return False
    return not line.endswith(("\\", "_", "~"))


def insert_plain_code(cursor: QTextCursor, text: str, style: RenderStyle) -> None:
    """`text` as a new code block, monospace on the code background, unhighlighted and without
    a header; long lines wrap (a tool's result is often one long line of JSON)."""
    fmt = _code_block_format(_code_background(style))
    fmt.setNonBreakableLines(False)
    cursor.insertBlock(fmt, code_char_format())
    cursor.insertText(text, code_char_format())


def _code_background(style: RenderStyle) -> QColor:
    style_name = DARK_CODE_STYLE if style.dark else LIGHT_CODE_STYLE
    return QColor(get_style_by_name(style_name).background_color)


def _insert_code_block(
    cursor: QTextCursor, segment: Segment, style: RenderStyle, copy_href: str
) -> None:
    style_name = DARK_CODE_STYLE if style.dark else LIGHT_CODE_STYLE
    background = _code_background(style)
    _insert_code_header(cursor, segment.language or "", style, background, copy_href)
    cursor.insertBlock(_code_block_format(background), code_char_format())
    formats = _token_formats(style_name)
    for token_type, value in _lexer_for(segment.language or "").get_tokens(segment.text):
        cursor.insertText(value, _format_for(formats, token_type))
    if not cursor.block().text():
        cursor.deletePreviousChar()  # pygments always ends with a newline
    last_line = cursor.blockFormat()
    last_line.setBottomMargin(6)
    cursor.setBlockFormat(last_line)


def _insert_code_header(
    cursor: QTextCursor, language: str, style: RenderStyle, background: QColor, copy_href: str
) -> None:
    header = _code_block_format(background)
    header.setTopMargin(6)
    cursor.insertBlock(header, QTextCharFormat())
    label = QTextCharFormat()
    label.setForeground(style.muted_text)
    label.setFontPointSize(_small_point_size())
    cursor.insertText(f"{language or 'code'}  ", label)
    cursor.insertText("Copy", link_format(copy_href, style.link))


def link_format(href: str, color: QColor) -> QTextCharFormat:
    """A clickable rich-text anchor (used for every action link in the transcript)."""
    fmt = QTextCharFormat()
    fmt.setAnchor(True)
    fmt.setAnchorHref(href)
    fmt.setForeground(color)
    fmt.setFontUnderline(False)
    fmt.setFontPointSize(_small_point_size())
    return fmt


def _small_point_size() -> float:
    return max(QFontDatabase.systemFont(QFontDatabase.SystemFont.GeneralFont).pointSizeF() - 1, 7)


def _code_block_format(background: QColor) -> QTextBlockFormat:
    fmt = QTextBlockFormat()
    fmt.setBackground(background)
    fmt.setNonBreakableLines(True)
    fmt.setLeftMargin(4)
    fmt.setRightMargin(4)
    return fmt


def code_char_format() -> QTextCharFormat:
    """Monospace, in the system's fixed font."""
    fmt = QTextCharFormat()
    fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    fmt.setFontFamilies([fixed.family()])
    fmt.setFontFixedPitch(True)
    fmt.setFontStyleHint(QFont.StyleHint.Monospace)
    return fmt


@lru_cache(maxsize=64)
def _lexer_for(language: str) -> Lexer:
    try:
        return get_lexer_by_name(language, stripnl=False, ensurenl=True)
    except ClassNotFound:
        return TextLexer(stripnl=False, ensurenl=True)


@lru_cache(maxsize=4)
def _token_formats(style_name: str) -> dict[_TokenType, QTextCharFormat]:
    style = get_style_by_name(style_name)
    return {token_type: _char_format(spec) for token_type, spec in style}


def _format_for(formats: dict[_TokenType, QTextCharFormat], token_type: _TokenType) -> QTextCharFormat:
    while token_type not in formats and token_type.parent is not None:
        token_type = token_type.parent
    return formats.get(token_type, code_char_format())


def _char_format(spec: dict) -> QTextCharFormat:
    fmt = code_char_format()
    if spec["color"]:
        fmt.setForeground(QColor(f"#{spec['color']}"))
    if spec["bgcolor"]:
        fmt.setBackground(QColor(f"#{spec['bgcolor']}"))
    if spec["bold"]:
        fmt.setFontWeight(QFont.Weight.Bold)
    if spec["italic"]:
        fmt.setFontItalic(True)
    if spec["underline"]:
        fmt.setFontUnderline(True)
    return fmt

