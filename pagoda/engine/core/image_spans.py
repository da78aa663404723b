"""Where a prompt's images sit among its tokens, for the bookkeeping: each image is a run of
placeholder tokens whose embeddings the vision tower's output replaces.

Three rules follow from what an image is to a model:
- its placeholders are the same tokens for every image, so a block's hash also holds the
  content hash of each image overlapping it (`block_extra`): the same picture hits the prefix
  cache, another one does not, across restarts too (the disk tier keys blocks by hash);
- Gemma 3 attends bidirectionally within an image, so a prefill chunk never ends inside one
  (`chunk_end`): a chunk that would is cut before the image, or, where it starts at the image,
  takes the whole of it;
- a prefix hit never ends inside one either (`hit_end`): the rest of its tokens would need
  the image encoded again beside keys already cached.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """An image's placeholders: tokens offset .. offset + length of the prompt.
    pixels: what gives the vision tower its input, processed when first asked for
    (pagoda.engine.multimodal.placeholders.PendingPixels; bookkeeping never reads it).
    content_hash: the image's identity (pagoda.engine.multimodal.images)."""

    offset: int
    length: int
    content_hash: str
    pixels: object

    @property
    def end(self) -> int:
        return self.offset + self.length


def chunk_end(spans: Seq[ImageSpan], start: int, n: int) -> int:
    """How many of n tokens from `start` a prefill chunk takes so that it ends outside every
    image: cut before an image it would end inside, or past the end of one it starts at or
    within (possibly more than n: an image's tokens come whole)."""
    end = start + n
    for span in spans:
        if span.offset < end < span.end:
            end = span.offset if span.offset > start else span.end
    return end - start


def hit_end(spans: Seq[ImageSpan], num_tokens: int, block_size: int) -> int:
    """A prefix hit of num_tokens (whole blocks) cut back to a block boundary outside every
    image."""
    end = num_tokens
    for span in sorted(spans, key=lambda s: -s.offset):
        if span.offset < end < span.end:
            end = span.offset // block_size * block_size
    return end


def block_extra(spans: Seq[ImageSpan], start: int, end: int) -> bytes:
    """What a block of tokens start..end holds beside its token ids: the content hash and
    offset of each image overlapping it (empty for a block of text)."""
    return b"".join(f"{span.offset}:{span.content_hash};".encode() for span in spans
                    if span.offset < end and span.end > start)
