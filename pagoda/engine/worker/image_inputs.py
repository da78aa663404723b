"""A step's images: which rows of the flat batch are an image's placeholders, the vision
tower's embeddings for them, and the attention mask that lets an image's tokens see each other
(Gemma 3 attends bidirectionally within an image).

A causal model's prefill chunk may end inside an image (a SmolVLM tile, a Qwen2.5-VL image): its
embeddings are kept (`KeptImages`) for the chunk that takes its other tokens, so that each is
encoded once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

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


class ImageEmbedder(Protocol):
    def embed(self, pixels: list, device: torch.device) -> list[torch.Tensor]:
        """Each image's pixels -> its [tokens, text width] embeddings."""


@dataclass(slots=True)
class KeptImages:
    """The embeddings of images that a step's chunk ended inside, until a chunk takes their
    last tokens; at most `most` of them (a request stopped inside an image leaves its own,
    which the newer ones push out)."""

    most: int = 8
    # id(span) -> (span, its embeddings): the span held, so that its id stays its own.
    embeddings: dict[int, tuple[ImageSpan, torch.Tensor]] = field(default_factory=dict)

    def get(self, span: ImageSpan) -> torch.Tensor | None:
        kept = self.embeddings.get(id(span))
        return None if kept is None else kept[1]

    def update(self, rows: list[ImageRows], embeds: dict[int, torch.Tensor]) -> None:
        for r in rows:
            if r.last < r.span.length:
                self.embeddings[id(r.span)] = (r.span, embeds[id(r.span)])
            else:
                self.embeddings.pop(id(r.span), None)
        while len(self.embeddings) > self.most:
            del self.embeddings[next(iter(self.embeddings))]


def embed_images(tower: ImageEmbedder, rows: list[ImageRows], device: torch.device,
                 kept: KeptImages | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch rows, their embeddings): each image not in `kept` encoded, all in one call of
    the tower; those the step leaves unfinished kept."""
    spans = list({id(r.span): r.span for r in rows}.values())
    embeds = {id(s): kept.get(s) for s in spans} if kept is not None else {}
    todo = [s for s in spans if embeds.get(id(s)) is None]
    if todo:
        embeds |= {id(s): e for s, e in zip(todo, tower.embed([s.pixels for s in todo], device),
                                             strict=True)}
    if kept is not None:
        kept.update(rows, embeds)
    index = torch.cat([torch.arange(r.flat_start, r.flat_start + r.last - r.first)
                       for r in rows]).to(device)
    values = torch.cat([embeds[id(r.span)][r.first:r.last] for r in rows])
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
