"""Text held back while streaming: the end of a delta that may be the start of a tag."""

from __future__ import annotations

from collections.abc import Iterable


def partial_tag_length(text: str, tags: Iterable[str]) -> int:
    """How many characters at the end of text could begin one of tags (0 when none could).

    Those characters wait for the next delta, which says whether the tag follows; everything
    before them can be shown at once."""
    tags = tuple(tags)
    longest = min(len(text), max(len(tag) for tag in tags) - 1)
    for size in range(longest, 0, -1):
        tail = text[-size:]
        if any(tag.startswith(tail) for tag in tags):
            return size
    return 0
