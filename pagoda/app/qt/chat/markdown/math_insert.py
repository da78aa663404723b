"""Formulas into a QTextDocument: each placeholder that hide_math left becomes the drawn formula.

An inline formula is an image in the line, its baseline on the text's; a display formula is an
image alone in a centred block. A formula that does not parse (or is too long to draw) is shown
as it was written, in monospace. A formula takes the size and colour of the text around it.
"""

from __future__ import annotations

import logging
import secrets

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QFontInfo,
    QFontMetricsF,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextImageFormat,
)

from pagoda.app.qt.chat.markdown.markdown_math import Formula, HiddenMath
from pagoda.app.qt.chat.markdown.math_render import MathImage, MathLook, render_math

logger = logging.getLogger(__name__)

RESOURCE_SCHEME = "pagoda-math"
# Part of every formula image's name, so that a model's Markdown cannot show one of them.
_RESOURCE_HOST = secrets.token_hex(8)
_LINE_SEPARATOR = "\u2028"
_SPACES = " \t" + _LINE_SEPARATOR
DISPLAY_MARGIN = 4  # px above and below a display formula
# ziamath's font (STIX Two Math) has a smaller x-height than the usual UI sans: at the same em
# size formulas look a size smaller than the text around them.
MATH_SCALE = 1.15


def insert_formulas(
    end: QTextCursor, start: int, hidden: HiddenMath, color: QColor, device_pixel_ratio: float
) -> None:
    """Swap the placeholders of `hidden` between `start` and `end` for the formulas drawn.

    A formula is drawn in `color` unless the text around it has a colour of its own (a quote's, a
    link's). `end` is a cursor at the end of the prose, which follows the edits made here.
    """
    document = end.document()
    for index, formula in enumerate(hidden.formulas):
        found = document.find(hidden.placeholder(index), start)
        if found.isNull() or found.selectionEnd() > end.position():
            logger.debug("formula %d has no placeholder in the text (a link's address?)", index)
            continue
        _replace(found, formula, color, device_pixel_ratio)


def _resource_name(drawn: MathImage) -> QUrl:
    """The name a drawn formula's image has in a document (the same for each drawing of it)."""
    return QUrl(f"{RESOURCE_SCHEME}://{_RESOURCE_HOST}/{drawn.serial}")


def _replace(found: QTextCursor, formula: Formula, color: QColor, device_pixel_ratio: float) -> None:
    around = found.charFormat()
    if formula.display:
        _isolate(found)
    look = _look(around, found.document(), color, device_pixel_ratio, formula.display)
    drawn = render_math(formula.source, look)
    if drawn is None:
        found.insertText(formula.written.replace("\n", _LINE_SEPARATOR), _written_format(around))
        return
    found.document().addResource(
        QTextDocument.ResourceType.ImageResource, _resource_name(drawn), drawn.image
    )
    found.insertImage(_image_format(around, drawn))
    if formula.display:
        _center(found)


def _look(
    around: QTextCharFormat, document: QTextDocument, color: QColor, ratio: float, display: bool
) -> MathLook:
    if around.hasProperty(QTextFormat.Property.ForegroundBrush):
        color = around.foreground().color()
    pixel_size = round(QFontInfo(_font(around, document)).pixelSize() * MATH_SCALE)
    metrics = QFontMetricsF(around.font())  # as Qt measures the image's format to align it
    return MathLook(color.name(), pixel_size, display, ratio, metrics.descent(), metrics.xHeight())


def _font(around: QTextCharFormat, document: QTextDocument) -> QFont:
    """The font of the text around a formula, a heading's larger size included."""
    font = QFont(document.defaultFont())
    if around.hasProperty(QTextFormat.Property.FontPointSize):
        font.setPointSizeF(around.fontPointSize())
        return font
    # Qt sizes a heading by an adjustment it applies to the application font's size.
    scale = around.font().pointSizeF() / QFont().pointSizeF()
    if font.pointSizeF() > 0 and scale > 0:
        font.setPointSizeF(font.pointSizeF() * scale)
    return font


def _image_format(around: QTextCharFormat, drawn: MathImage) -> QTextImageFormat:
    fmt = QTextImageFormat()
    fmt.merge(around)  # the text's font and a link around the formula stay
    fmt.setName(_resource_name(drawn).toString())
    fmt.setWidth(drawn.width)
    fmt.setHeight(drawn.height)
    fmt.setVerticalAlignment(drawn.alignment)
    return fmt


def _written_format(around: QTextCharFormat) -> QTextCharFormat:
    fmt = QTextCharFormat(around)
    fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    fmt.setFontFamilies([fixed.family()])
    fmt.setFontFixedPitch(True)
    fmt.setFontStyleHint(QFont.StyleHint.Monospace)
    return fmt


def _isolate(found: QTextCursor) -> None:
    """Make the selected placeholder the only text of its block, splitting the block around it."""
    _trim_around(found)
    block = found.block()
    start, length = found.selectionStart(), found.selectionEnd() - found.selectionStart()
    text_after = found.selectionEnd() < block.position() + block.length() - 1
    if start > block.position():
        _split_block(found.document(), start)
        start += 1
    if text_after:
        _split_block(found.document(), start + length)
    found.setPosition(start)
    found.setPosition(start + length, QTextCursor.MoveMode.KeepAnchor)


def _trim_around(found: QTextCursor) -> None:
    """Drop the spaces and line breaks that separated the placeholder from its neighbours."""
    block = found.block()
    text = block.text()
    start = found.selectionStart() - block.position()
    end = found.selectionEnd() - block.position()
    after = len(text[end:]) - len(text[end:].lstrip(_SPACES))
    before = start - len(text[:start].rstrip(_SPACES))
    _delete(found.document(), found.selectionEnd(), after)
    _delete(found.document(), found.selectionStart() - before, before)


def _delete(document: QTextDocument, position: int, count: int) -> None:
    if count:
        cursor = QTextCursor(document)
        cursor.setPosition(position)
        cursor.setPosition(position + count, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()


def _split_block(document: QTextDocument, position: int) -> None:
    """A new block from `position` on; in a list it continues the item rather than being one."""
    cursor = QTextCursor(document)
    cursor.setPosition(position)
    text_list = cursor.block().textList()
    cursor.insertBlock()
    if text_list is not None:
        text_list.remove(cursor.block())


def _center(found: QTextCursor) -> None:
    fmt = found.blockFormat()
    fmt.setAlignment(Qt.AlignmentFlag.AlignHCenter)
    fmt.setTopMargin(max(fmt.topMargin(), DISPLAY_MARGIN))
    fmt.setBottomMargin(max(fmt.bottomMargin(), DISPLAY_MARGIN))
    found.setBlockFormat(fmt)
