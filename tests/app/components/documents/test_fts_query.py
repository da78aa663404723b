"""fts_query: a question as an FTS5 MATCH expression for a trigram index, checked against a
real SQLite FTS5 table."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagoda.app.components.documents import fts_query
from pagoda.app.components.documents.passages.retrieval_query import MAX_TERM_CHARS, MAX_TERMS

PASSAGES = [
    "The harbour master counted forty boats at dawn.",
    "Revenue grew by 12 percent in the state-of-the-art plant (v1.2.3).",
    "港口的渔民在清晨数了四十条船。",
    "東京の天気は晴れです。",
    'She said "NEAR" and AND are only words here; parse_config reads them.',
]


@pytest.fixture
def index() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE VIRTUAL TABLE passages USING fts5(body, tokenize='trigram')")
    connection.executemany("INSERT INTO passages(body) VALUES (?)", [(p,) for p in PASSAGES])
    yield connection
    connection.close()


def matching(index: sqlite3.Connection, question: str) -> list[int]:
    query = fts_query(question)
    assert query is not None
    rows = index.execute("SELECT rowid FROM passages WHERE passages MATCH ? ORDER BY rank",
                         (query,))
    return [rowid - 1 for (rowid,) in rows]


@pytest.mark.parametrize(("question", "expected"), [
    ("What is the revenue growth?", '"revenue" OR "growth"'),
    ("How many BOATS did the harbour master count?", '"boats" OR "harbour" OR "master" OR "count"'),
    ('say "hello" to the "world"', '"hello" OR "world"'),
    ('quote " in the middle of"nowhere', '"quote" OR "middle" OR "nowhere"'),
    ("budget* AND (forecast OR plan)", '"budget" OR "forecast" OR "plan"'),
    ("NEAR(pier boats, 5)", '"pier" OR "boats"'),
    ("body:tides -storm ^start", '"body" OR "tides" OR "storm" OR "start"'),
    ("🚀🚀 launch plan 🚀", '"launch" OR "plan"'),
    ("state-of-the-art plant", '"state-of-the-art" OR "state" OR "art" OR "plant"'),
    ("release v1.2.3", '"release" OR "v1.2.3"'),
    ("Revenue revenue REVENUE", '"revenue"'),
    ("parse_config function", '"parse_config" OR "function"'),
    ("don’t panic", '"panic"'),
    ("in 2023 the pier", '"2023" OR "pier"'),
    ("café crème", '"café" OR "crème"'),
    ("人工智能的发展", '"人工智" OR "工智能" OR "智能的" OR "能的发" OR "的发展"'),
    ("東京の天気", '"東京の" OR "京の天" OR "の天気"'),
    ("한국어 문법", '"한국어"'),
    ("报告 and 港口的船", '"港口的" OR "口的船"'),
])
def test_question_becomes_quoted_terms_joined_by_or(question: str, expected: str) -> None:
    assert fts_query(question) == expected


@pytest.mark.parametrize("question", [
    "", "   ", "a an of is it", "What is this about?", "?!*()\"'", "🚀🎉", "报告", "AND OR NOT NEAR",
])
def test_question_with_nothing_searchable_gives_none(question: str) -> None:
    assert fts_query(question) is None


def test_terms_are_bounded_in_number() -> None:
    question = " ".join(f"word{n:04d}" for n in range(5000))

    query = fts_query(question)

    assert query is not None
    assert query.count(" OR ") == MAX_TERMS - 1
    assert query.startswith('"word0000" OR "word0001"')


def test_a_huge_term_is_cut_to_the_term_bound() -> None:
    assert fts_query("x" * 100_000) == '"' + "x" * MAX_TERM_CHARS + '"'


def test_a_long_chinese_run_gives_at_most_the_term_bound() -> None:
    query = fts_query("港口的渔民在清晨数了四十条船" * 100)

    assert query is not None and query.count(" OR ") < MAX_TERMS


def test_query_finds_the_passage_it_names(index: sqlite3.Connection) -> None:
    assert matching(index, "How many boats did the harbour master count?")[0] == 0
    assert matching(index, "revenue of the state of the art plant")[0] == 1
    assert matching(index, "渔民在清晨数了几条船？")[0] == 2
    assert matching(index, "東京の天気は？") == [3]
    assert matching(index, 'what does "NEAR" AND parse_config do?')[0] == 4


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_question_gives_a_query_sqlite_accepts(question: str) -> None:
    query = fts_query(question)
    if query is None:
        return
    connection = sqlite3.connect(":memory:")
    try:
        connection.execute("CREATE VIRTUAL TABLE t USING fts5(body, tokenize='trigram')")
        connection.execute("SELECT * FROM t WHERE t MATCH ?", (query,)).fetchall()
    finally:
        connection.close()
