"""Text on its way into SQLite, which stores UTF-8: lone surrogates cannot be encoded.

Pasted text and decoded JSON can carry them (half an emoji). Each becomes U+FFFD, the Unicode
replacement character, wherever text enters the store: columns and search queries alike, so a
search for the pasted text finds what was stored. NUL characters are ordinary text here.
"""

import re

LONE_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def replace_lone_surrogates(text: str) -> str:
    return LONE_SURROGATE.sub(REPLACEMENT, text)
