"""Turning what the user typed into a safe FTS5 query or a substring scan, and rendering snippets.

The trigram tokenizer indexes every 3-character substring, so a term shorter than 3 characters
(a 2-character Chinese word such as 北京) cannot be matched by FTS5. FTS5 also reads its query
as a C string, which a NUL character would cut short. Such queries scan for substrings instead.

Snippets are cut here, not by FTS5's snippet(): its time grows with the square of a message's
hits (a pasted log of repeated lines took 126 s at 1 MB), on the thread every store call waits
for. Ours reads the text once and looks at no more than MAX_SNIPPET_HITS hits.
"""

import html
import re
from itertools import islice, takewhile

from ..sanitize import replace_lone_surrogates

MIN_FTS_TERM = 3
# Private-use characters mark hits inside SQL and Python snippets; they are swapped for the
# caller's markers only after the text has been escaped, so markers never get escaped.
HIT_OPEN = "\ue000"
HIT_CLOSE = "\ue001"
ELLIPSIS = "…"
SNIPPET_CONTEXT = 20
SNIPPET_WIDTH = 80
MAX_SNIPPET_HITS = 256  # looked at for the window that shows the most terms


def search_terms(query: str) -> list[str]:
    return replace_lone_surrogates(query).split()


def needs_substring_scan(terms: list[str]) -> bool:
    return any(len(term) < MIN_FTS_TERM or "\x00" in term for term in terms)


def fts_match_expression(terms: list[str]) -> str:
    """Every term as a quoted string, so `"`, `AND(`, `*` or `NEAR` are plain text; all must match."""
    return " ".join('"' + term.replace('"', '""') + '"' for term in terms)


def snippet(text: str, terms: list[str]) -> str:
    """A window of the text with every hit in it marked: the first one that shows the most
    different terms, around one of the first MAX_SNIPPET_HITS hits. Linear in the text."""
    pattern = _terms_pattern(terms)
    hits = list(islice(pattern.finditer(text), MAX_SNIPPET_HITS))
    # A window that would pass the end starts earlier instead: a short text is shown whole.
    start = max(0, min(_window_start(hits), len(text) - SNIPPET_WIDTH))
    end = min(len(text), start + SNIPPET_WIDTH)
    window = pattern.sub(lambda hit: f"{HIT_OPEN}{hit.group(0)}{HIT_CLOSE}", text[start:end])
    prefix = ELLIPSIS if start > 0 else ""
    suffix = ELLIPSIS if end < len(text) else ""
    return prefix + window + suffix


def _window_start(hits: list[re.Match[str]]) -> int:
    best_start, best_count = 0, 0
    for i, first in enumerate(hits):
        start = max(0, first.start() - SNIPPET_CONTEXT)
        end = start + SNIPPET_WIDTH
        inside = takewhile(lambda hit, end=end: hit.end() <= end, islice(hits, i, None))
        shown = len({hit.group(0).casefold() for hit in inside})
        if shown > best_count:
            best_start, best_count = start, shown
    return best_start


def render_snippet(raw: str, markers: tuple[str, str], escape_html: bool) -> str:
    text = " ".join(raw.split())
    if escape_html:
        text = html.escape(text, quote=False)
    return text.replace(HIT_OPEN, markers[0]).replace(HIT_CLOSE, markers[1])


def _terms_pattern(terms: list[str]) -> re.Pattern[str]:
    longest_first = sorted(set(terms), key=len, reverse=True)
    return re.compile("|".join(re.escape(term) for term in longest_first), re.IGNORECASE)
