"""A conversation's automatic title, taken from its first user message; an imported one's.

Stored without an ellipsis: the sidebar, the tabs and the window elide a title to the room
they have as they draw it, so a title the user renames holds only words they wrote. Math in
the message reads as plain text there ("$\\frac{a}{b}$" as "a/b"): no view renders TeX in a
title."""

from .plain_math import plain_math

# Longer than any view shows whole; a first line longer than this is cut at a word boundary.
TITLE_LIMIT = 120
# Of the message's start, what is read for its first line (math spans lines: $$ … $$).
SOURCE_CHARS = 8 * TITLE_LIMIT


def auto_title(text: str, limit: int = TITLE_LIMIT) -> str | None:
    """The first non-empty line, its math as plain text, cut at a word boundary near `limit`
    characters."""
    source = plain_math(text.lstrip()[:SOURCE_CHARS])
    line = next((line.strip() for line in source.splitlines() if line.strip()), "")
    line = " ".join(line.split())
    if not line:
        return None
    if len(line) <= limit:
        return line
    cut = line[:limit]
    boundary = cut.rfind(" ")
    # Text without spaces (Chinese, a long URL) is cut at the limit itself.
    if boundary >= limit // 2:
        cut = cut[:boundary]
    return cut.rstrip(" ,.;:-")


def imported_title(title: str | None, taken: set[str | None]) -> str | None:
    """An imported chat's title: its own, unless a chat already has it, then "<title>
    (imported)", "(imported 2)"... so the copy and its original can be told apart in the list.
    A new title is added to `taken`; a title kept is not, so an export restored into an empty
    database keeps its repeated titles."""
    if title is None or title not in taken:
        return title
    chosen = f"{title} (imported)"
    copies = 1
    while chosen in taken:
        copies += 1
        chosen = f"{title} (imported {copies})"
    taken.add(chosen)
    return chosen
