"""LaTeX drawn into an image: ziamath typesets it as SVG (pure Python), QtSvg rasterizes it.

A transcript re-renders its messages (a palette change, a new reply below), so drawn formulas are
kept in a bounded LRU cache; a formula that does not parse is cached too, as None.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from functools import lru_cache

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QImage, QPainter, QTextCharFormat
from PySide6.QtSvg import QSvgRenderer

logger = logging.getLogger(__name__)

MAX_SOURCE_CHARS = 2000  # longer formulas are shown as written: typesetting time grows with them
CACHE_SIZE = 256  # drawn formulas kept; each is a few KB to a few hundred KB of pixels
_serials = itertools.count()


@dataclass(slots=True, frozen=True)
class MathLook:
    """How a formula is drawn: colour ("#rrggbb"), em size and the screen's device pixel ratio.

    `text_descent` and `x_height` are those of the text around an inline formula (the font of its
    image's format): Qt aligns an inline image by them, so they decide the padding that puts the
    formula's baseline on the text's.
    """

    color: str
    pixel_size: int
    display: bool
    device_pixel_ratio: float = 1.0
    text_descent: float = 0.0
    x_height: float = 0.0


@dataclass(slots=True, frozen=True)
class MathImage:
    """A drawn formula: `image` at the device pixel ratio, `width` x `height` in logical pixels.

    `serial` tells drawings apart, so a document can name each image once and for good.
    """

    image: QImage
    width: float
    height: float
    serial: int
    alignment: QTextCharFormat.VerticalAlignment


def render_math(source: str, look: MathLook) -> MathImage | None:
    """`source` (LaTeX) drawn as `look` says; None when it is too long or does not parse."""
    if len(source) > MAX_SOURCE_CHARS:
        return None
    return _render_cached(source, look)


@lru_cache(maxsize=CACHE_SIZE)
def _render_cached(source: str, look: MathLook) -> MathImage | None:
    svg = _typeset(source, look)
    return None if svg is None else _rasterize(svg, look)


def _typeset(source: str, look: MathLook) -> bytes | None:
    ziamath = _ziamath()
    try:
        latex = ziamath.Latex(source, size=look.pixel_size, color=look.color, inline=not look.display)
        return latex.svg().encode()
    except Exception as error:  # noqa: BLE001 - latex2mathml's, XML's, ziamath's: shown as written
        logger.debug("formula not drawn (%s: %s): %.80s", type(error).__name__, error, source)
        return None


@lru_cache(maxsize=1)
def _ziamath():  # imported on first use, not at start-up: it takes ~0.2 s
    import ziamath

    # SVG 2 output draws glyphs as <symbol>s that QtSvg (SVG Tiny 1.2) mostly leaves out.
    ziamath.config.svg2 = False
    return ziamath


def _rasterize(svg: bytes, look: MathLook) -> MathImage | None:
    renderer = QSvgRenderer(QByteArray(svg))
    if not renderer.isValid():
        logger.debug("ziamath's SVG did not load in QtSvg")
        return None
    box = renderer.viewBoxF()  # the formula's baseline is at y = 0
    top, bottom, alignment = _placement(-box.top(), box.bottom(), look)
    ratio = look.device_pixel_ratio
    image = QImage(math.ceil(box.width() * ratio), math.ceil((top + box.height() + bottom) * ratio),
                   QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    # Measured from the bottom, which Qt pins to the text: rounding up adds rows at the top.
    formula_top = image.height() - (box.height() + bottom) * ratio
    renderer.render(painter, QRectF(0, formula_top, box.width() * ratio, box.height() * ratio))
    painter.end()
    image.setDevicePixelRatio(ratio)
    return MathImage(image, image.width() / ratio, image.height() / ratio, next(_serials), alignment)


def _placement(
    ascent: float, depth: float, look: MathLook
) -> tuple[float, float, QTextCharFormat.VerticalAlignment]:
    """Transparent rows above and below a formula, and the alignment for its image, that put its
    baseline on the text's.

    Qt puts the bottom of an AlignBaseline image at the text's descent below the baseline, so a
    formula no deeper than that is padded down to it and leaves the line's height alone. A deeper
    one is an AlignMiddle image, which Qt sets to descend (height - x_height / 2) / 2: that is the
    formula's depth once the ascent above it is the depth plus x_height / 2.
    """
    alignment = QTextCharFormat.VerticalAlignment
    if look.display:
        return 0.0, 0.0, alignment.AlignBaseline
    if depth <= look.text_descent:
        return 0.0, look.text_descent - depth, alignment.AlignBaseline
    shortfall = depth + look.x_height / 2 - ascent
    return max(shortfall, 0.0), max(-shortfall, 0.0), alignment.AlignMiddle
