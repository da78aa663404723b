"""A user's question turned into an SQLite FTS5 MATCH expression for an index built with the
`trigram` tokenizer, which finds any substring of three characters or more, case-insensitively.

Each term is a double-quoted FTS5 string, so nothing in a question is read as query syntax (AND,
NEAR, *, parentheses, column filters); the terms are OR'd and left to bm25 to rank. Words shorter
than three characters can never match a trigram index, so they are dropped with English stop
words. Chinese and Japanese, written without spaces, are cut into overlapping three-character
pieces, each a term: 人工智能 gives 人工智 and 工智能, so a passage with either matches."""

from __future__ import annotations

import re

from pagoda.app.components.documents.passages.cjk import CJK_CLASS

MAX_TERMS = 32
# Past these a question is cut: what it costs to turn it into terms stays bounded.
MAX_QUESTION_CHARS = 4_000
MAX_TERM_CHARS = 48
_MIN_TERM_CHARS = 3  # the trigram tokenizer's shortest searchable substring

# A run of Chinese or Japanese characters, or a word (letters, digits, "_") that may hold inner
# hyphens, dots and apostrophes: state-of-the-art, v1.2.3, o'clock.
_TOKEN = re.compile(rf"[{CJK_CLASS}]+|[^\W{CJK_CLASS}]+(?:[-.'’][^\W{CJK_CLASS}]+)*")
_CJK_CHARACTER = re.compile(f"[{CJK_CLASS}]")
_INNER_PUNCTUATION = re.compile(r"[-.'’]")

# English words too common to tell passages apart (shorter ones are dropped anyway).
STOP_WORDS = frozenset({
    "about", "above", "after", "again", "against", "all", "also", "and", "any", "are", "aren",
    "aren't", "because", "been", "before", "being", "below", "between", "both", "but", "can",
    "can't", "cannot", "could", "couldn", "couldn't", "did", "didn", "didn't", "does", "doesn",
    "doesn't", "doing", "don", "don't", "down", "during", "each", "either", "else", "etc", "ever",
    "every", "few", "for", "from", "further", "had", "hadn", "hadn't", "has", "hasn", "hasn't",
    "have", "haven", "haven't", "having", "her", "here", "hers", "herself", "him", "himself",
    "his", "how", "however", "into", "isn", "isn't", "it's", "its", "itself", "just", "let",
    "let's", "like", "many", "may", "might", "more", "most", "much", "must", "mustn", "mustn't",
    "myself", "near", "neither", "nor", "not", "now", "off", "once", "only", "other", "ought",
    "our", "ours", "ourselves", "out", "over", "own", "per", "please", "same", "shall", "shan",
    "shan't", "she", "should", "shouldn", "shouldn't", "since", "some", "such", "than", "that",
    "that's", "the", "their", "theirs", "them", "themselves", "then", "there", "there's", "these",
    "they", "this", "those", "though", "through", "thus", "too", "under", "until", "upon", "very",
    "was", "wasn", "wasn't", "were", "weren", "weren't", "what", "what's", "when", "where",
    "where's", "whether", "which", "while", "who", "who's", "whom", "whose", "why", "will", "with",
    "within", "without", "won", "won't", "would", "wouldn", "wouldn't", "yes", "yet", "you",
    "your", "yours", "yourself", "yourselves", "tell", "explain", "describe", "show", "give",
    "find", "say", "says", "said", "know", "want", "need", "get", "got",
})


def fts_query(question: str) -> str | None:
    """`question` as a MATCH expression of up to MAX_TERMS quoted terms joined by OR, in the order
    they appear; None when no term of three characters or more remains."""
    terms = search_terms(question)
    if not terms:
        return None
    return " OR ".join(_quoted(term) for term in terms)


def search_terms(question: str) -> list[str]:
    """The distinct terms of `question`, lower-cased, in order, at most MAX_TERMS of them."""
    terms: dict[str, None] = {}
    for token in _TOKEN.findall(question[:MAX_QUESTION_CHARS]):
        for term in _terms_of(token):
            terms.setdefault(term[:MAX_TERM_CHARS])
            if len(terms) == MAX_TERMS:
                return list(terms)
    return list(terms)


def _terms_of(token: str) -> list[str]:
    if _is_cjk(token[0]):
        return _pieces(token)
    word = token.lower().replace("’", "'")
    parts = _INNER_PUNCTUATION.split(word)
    candidates = [word, *parts] if len(parts) > 1 else [word]
    return [term for term in candidates if _searchable(term)]


def _pieces(run: str) -> list[str]:
    """A run of Chinese or Japanese as overlapping pieces of three characters."""
    return [run[i:i + _MIN_TERM_CHARS] for i in range(len(run) - _MIN_TERM_CHARS + 1)]


def _searchable(word: str) -> bool:
    return len(word) >= _MIN_TERM_CHARS and word not in STOP_WORDS


def _is_cjk(character: str) -> bool:
    return _CJK_CHARACTER.match(character) is not None


def _quoted(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'

