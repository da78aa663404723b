"""The bar left of a block quote, as GitHub draws it: a QTextDocument draws no border on one side
of a block, so the transcript paints the bars over its viewport, where these rectangles say.

A quote's blocks carry Qt's BlockQuoteLevel; markdown_render indents them QUOTE_INDENT per level,
and each level gets a bar in the space that indent leaves.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF
from PySide6.QtGui import QTextBlock, QTextFormat

QUOTE_INDENT = 14  # px per level of a quote: a bar, then the gap to the text
BAR_WIDTH = 3


def quote_bars(first: QTextBlock, bottom: float) -> list[QRectF]:
    """The bars of the quotes from block `first` down to `bottom`, in document coordinates."""
    bars: list[QRectF] = []
    block = first.previous() if first.previous().isValid() else first
    layout = first.document().documentLayout()
    while block.isValid() and layout.blockBoundingRect(block).top() <= bottom:
        bars.extend(_block_bars(block))
        block = block.next()
    return bars


def quote_level(block: QTextBlock) -> int:
    """How deep in quotes a block is: 0 outside any."""
    if not block.isValid():
        return 0
    return block.blockFormat().intProperty(QTextFormat.Property.BlockQuoteLevel)


def _block_bars(block: QTextBlock) -> list[QRectF]:
    level = quote_level(block)
    if not level or block.layout().lineCount() == 0:
        return []
    layout = block.document().documentLayout()
    rect = layout.blockBoundingRect(block)
    text_left = rect.left() + block.layout().lineAt(0).x()
    following = block.next()
    # A bar runs on through the gap to the next block when that block is quoted as deep.
    following_top = layout.blockBoundingRect(following).top() if following.isValid() else 0.0
    bars = []
    for depth in range(1, level + 1):
        left = text_left - (level - depth + 1) * QUOTE_INDENT
        end = following_top if quote_level(following) >= depth else rect.bottom()
        bars.append(QRectF(left, rect.top(), BAR_WIDTH, end - rect.top()))
    return bars
