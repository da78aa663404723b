"""A conversation's automatic title, taken from its first user message.

Stored without an ellipsis: the sidebar, the tabs and the window elide a title to the room
they have as they draw it, so a title the user renames holds only words they wrote."""

# Longer than any view shows whole; a first line longer than this is cut at a word boundary.
TITLE_LIMIT = 120


def auto_title(text: str, limit: int = TITLE_LIMIT) -> str | None:
    """The first non-empty line, cut at a word boundary near `limit` characters."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
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
