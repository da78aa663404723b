"""Chinese and Japanese passages made searchable by two-character words. Their words are mostly
two characters long (北京, 长城, 报告), which a trigram index cannot match, so each passage with
such text is also indexed as its overlapping character pairs, each a token of its own
(`attachment_chunks_cjk`, FTS5's unicode61 tokenizer, ranked by bm25): 长城全长 gives
长城 城全 全长. A question is cut the same way."""

from __future__ import annotations

import re

CJK_CLASS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_RUN = re.compile(f"[{CJK_CLASS}]+")
MAX_QUERY_GRAMS = 32


def grams(text: str) -> list[str]:
    """The overlapping character pairs of every Chinese or Japanese run (a lone character
    stands for itself), in order."""
    out: list[str] = []
    for run in _RUN.findall(text):
        out += [run] if len(run) == 1 else [run[i:i + 2] for i in range(len(run) - 1)]
    return out


def indexed_text(text: str) -> str | None:
    """What the pair index holds for a passage; None for a passage with no such text."""
    found = grams(text)
    return " ".join(found) if found else None


def match_expression(question: str) -> str | None:
    """A question's pairs as an FTS5 expression (each quoted, OR'd, distinct, at most
    MAX_QUERY_GRAMS); None for a question with no Chinese or Japanese."""
    distinct = list(dict.fromkeys(grams(question)))[:MAX_QUERY_GRAMS]
    return " OR ".join(f'"{gram}"' for gram in distinct) if distinct else None
