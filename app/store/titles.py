"""A conversation's automatic title, taken from its first user message."""

TITLE_LIMIT = 60
ELLIPSIS = "…"


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
    return cut.rstrip(" ,.;:-") + ELLIPSIS
