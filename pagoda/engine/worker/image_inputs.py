"""A step's images: which rows of the flat batch are an image's placeholders, the vision
tower's embeddings for them, and the attention mask that lets an image's tokens see each other
(Gemma 3 attends bidirectionally within an image)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pagoda.engine.core.image_spans import ImageSpan


@dataclass(frozen=True, slots=True)
class ImageRows:
    """Rows flat_start .. flat_start + (last - first) of the batch take the image's embeddings
    first .. last."""

    span: ImageSpan
    flat_start: int
    first: int
    last: int


def image_rows(spans: Sequence[ImageSpan], start: int, end: int,
               flat_start: int) -> list[ImageRows]:
    """The images among a chunk's tokens start..end, whose first token is the batch's row
    flat_start."""
    rows = []
    for span in spans:
        first, last = max(start, span.offset), min(end, span.end)
        if first < last:
            rows.append(ImageRows(span, flat_start + first - start, first - span.offset,
                                  last - span.offset))
    return rows


def embed_images(tower: Callable[[torch.Tensor], torch.Tensor], rows: list[ImageRows],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch rows, their embeddings): each image encoded once, all in one call of the tower."""
    spans = list(dict.fromkeys(r.span for r in rows))
    embeds = tower(torch.stack([s.pixels.tensor() for s in spans]).to(device))
    where = {span: i for i, span in enumerate(spans)}
    index = torch.cat([torch.arange(r.flat_start, r.flat_start + r.last - r.first)
                       for r in rows]).to(device)
    values = torch.cat([embeds[where[r.span], r.first:r.last] for r in rows])
    return index, values


def images_among(spans: Sequence[ImageSpan], first: int, end: int) -> list[ImageSpan]:
    """The images whose tokens meet the queries at prompt positions first .. end - 1."""
    return [span for span in spans if span.offset < end and span.end > first]


def within_images(spans: Sequence[ImageSpan], query_pos: torch.Tensor,
                  key_pos: torch.Tensor) -> torch.Tensor:
    """True where a query and a key are tokens of the same image (positions as the prompt's)."""
    mask = torch.zeros(query_pos.shape[0], key_pos.shape[-1], dtype=torch.bool,
                       device=query_pos.device)
    for span in spans:
        mask |= (((query_pos >= span.offset) & (query_pos < span.end))
                 & ((key_pos >= span.offset) & (key_pos < span.end)))
    return mask
