"""Where a sequence's tokens sit for multimodal RoPE (Qwen2.5-VL): each token has a time, a
row and a column position. A text token's three are one number, which counts on from the
token before it; an image's tokens all share the time of the image's first, and take rows and
columns of its grid from there; the text after an image continues from one past the image's
largest position (its first plus its longer side), not from its token count.

So positions run behind token indices by a fixed `offset` after each image, and a sequence's
positions are a function of its tokens and its images alone: a prefix hit reuses keys cached at
the very positions it would compute, and a decode step's position is its index plus the offset
after the prompt's last image (one row: text rotates as plain RoPE).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagoda.engine.core.image_spans import ImageSpan
from pagoda.engine.worker.image_inputs import images_among


def position_offset(spans: Sequence[ImageSpan], index: int) -> int:
    """What a text token at `index` adds to its index for its position: each earlier image's
    extent (its longer side) less its tokens."""
    return sum(_extent(span) - span.length for span in spans if span.end <= index)


def chunk_positions(spans: Sequence[ImageSpan], start: int, end: int) -> torch.Tensor | None:
    """[3, end - start] time, row and column positions of tokens start .. end - 1 where the
    chunk holds an image's tokens; None where it holds text only (its positions: the indices
    plus `position_offset(spans, start)`)."""
    if not images_among(spans, start, end):
        return None
    positions = torch.arange(start, end).repeat(3, 1)
    for span in spans:
        if span.end <= start:
            positions += _extent(span) - span.length
        elif span.offset < end:
            first = span.offset + position_offset(spans, span.offset)
            _place_image(positions, span, first, start, end)
    return positions


def _place_image(positions: torch.Tensor, span: ImageSpan, first: int, start: int,
                 end: int) -> None:
    """The image's tokens among the chunk on its grid from `first` (its first token's
    position), and the text after it offset."""
    _, columns = span.grid
    lo, hi = max(start, span.offset), min(end, span.end)
    k = torch.arange(lo - span.offset, hi - span.offset)
    at = slice(lo - start, hi - start)
    positions[0, at] = first
    positions[1, at] = first + k // columns
    positions[2, at] = first + k % columns
    positions[:, hi - start:] += _extent(span) - span.length


def _extent(span: ImageSpan) -> int:
    rows, columns = span.grid
    return max(rows, columns)
