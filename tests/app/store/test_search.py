"""Search: FTS5 trigram for 3+ characters, a substring scan for shorter terms; English, Chinese."""

import time

import pytest

from pagoda.app.store import ConversationStore
from pagoda.app.store.search import search


@pytest.fixture
def filled(store: ConversationStore) -> ConversationStore:
    geography = store.create_conversation("Geography").id
    store.append_user_message(geography, "What is the capital of France? They speak French.")
    store.append_user_message(geography, "北京是中国的首都。我爱北京天安门。")
    cooking = store.create_conversation("Cooking").id
    store.append_user_message(cooking, "How do I make a French omelette?")
    store.append_user_message(cooking, 'Tips for <script> tags & AND( "quotes" in recipes')
    return store


def test_english_search_finds_messages_newest_first_with_snippets(filled) -> None:
    hits = filled.search("fren")
    assert [h.conversation_title for h in hits] == ["Cooking", "Geography"]
    assert hits[0].snippet == "How do I make a <b>Fren</b>ch omelette?"
    assert hits[1].snippet == "What is the capital of France? They speak <b>Fren</b>ch."
    assert hits[0].created_at > hits[1].created_at
    assert hits[0].role == "user"


def test_trigram_search_is_case_insensitive_and_matches_substrings(filled) -> None:
    hits = filled.search("CAPITAL")
    assert len(hits) == 1
    assert "<b>capital</b>" in hits[0].snippet


def test_chinese_three_characters_use_the_trigram_index(filled) -> None:
    hits = filled.search("中国的首都")
    assert [h.conversation_title for h in hits] == ["Geography"]
    assert "<b>中国的首都</b>" in hits[0].snippet
    assert "<b>天安门</b>" in filled.search("天安门")[0].snippet
    assert filled.search("首都是") == []  # a substring that is not in the text


def test_terms_shorter_than_a_trigram_or_with_nul_take_the_substring_scan() -> None:
    assert search.needs_substring_scan(["北京"]) and search.needs_substring_scan(["天安门", "a"])
    assert search.needs_substring_scan(["long\x00term"])
    assert not search.needs_substring_scan(["天安门", "capital"])


def test_match_expression_quotes_every_term() -> None:
    assert search.fts_match_expression(["AND(", 'say "hi"']) == '"AND(" "say ""hi"""'


def test_chinese_two_characters_fall_back_and_mark_every_hit(filled) -> None:
    hits = filled.search("北京")
    assert len(hits) == 1
    assert hits[0].snippet == "<b>北京</b>是中国的首都。我爱<b>北京</b>天安门。"


def test_short_english_terms_fall_back_too(filled) -> None:
    hits = filled.search("do")
    assert [h.conversation_title for h in hits] == ["Cooking"]
    assert "<b>do</b>" in hits[0].snippet


def test_all_terms_must_match(filled) -> None:
    assert [h.conversation_title for h in filled.search("french omelette")] == ["Cooking"]
    assert filled.search("omelette capital") == []
    assert [h.conversation_title for h in filled.search("北京 首都")] == ["Geography"]


@pytest.mark.parametrize(
    "query", ['"', "AND(", '"unbalanced', "NEAR(a b)", "col:umn", "*", "a%b_c", "OR", "-x", "^"]
)
def test_punctuation_never_raises(filled, query: str) -> None:
    filled.search(query)


def test_punctuation_is_searched_literally(filled) -> None:
    hits = filled.search('AND( "quotes"')
    assert len(hits) == 1
    assert "&amp;" in hits[0].snippet and "&lt;script&gt;" in hits[0].snippet
    assert filled.search("%") == [] and filled.search("_") == []


def test_snippet_markers_and_escaping_are_configurable(filled) -> None:
    hit = filled.search("script", markers=("[", "]"), escape_html=False)[0]
    assert "<[script]>" in hit.snippet


def test_long_messages_get_a_window_around_the_hit(store: ConversationStore) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "lorem ipsum " * 40 + "北京 needle " + "dolor sit " * 40)
    fts = store.search("needle")[0].snippet
    scanned = store.search("北京")[0].snippet
    for snippet in (fts, scanned):
        assert snippet.startswith("…") and snippet.endswith("…")
        assert len(snippet) < 200


def test_deleted_conversations_are_not_searched(filled) -> None:
    cooking = next(c for c in filled.list_conversations() if c.title == "Cooking")
    filled.delete(cooking.id)
    assert filled.search("omelette") == [] and filled.search("do") == []
    filled.undo_delete(cooking.id)
    assert len(filled.search("omelette")) == 1


def test_index_follows_streaming_edits_and_purges(store: ConversationStore) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "q")
    reply = store.start_assistant_message(cid)
    store.update_streaming(reply.id, "partial banana")
    assert [h.message_id for h in store.search("banana")] == [reply.id]
    store.finish_message(reply.id, "final mango", "stop")
    assert store.search("banana") == []
    assert [h.message_id for h in store.search("mango")] == [reply.id]
    store.purge(cid)
    assert store.search("mango") == []


def test_limit_and_empty_query(filled) -> None:
    assert len(filled.search("e", limit=2)) == 2
    assert filled.search("   ") == []


# FTS5's own snippet() took ~20 s here (126 s on a loaded machine) over 1 MB of repeated
# lines, and its time grows with the square of the size: 2 MB would take minutes.
REPEATED_TEXT_CHARS = 2 * 2**20
GENEROUS_SECONDS = 10.0


@pytest.mark.parametrize(("line", "query", "marked"), [
    ("2026-01-01 12:00:00 INFO worker started job queue ok\n", "worker started",
     ["<b>worker</b>", "<b>started</b>"]),
    ("任务队列已启动，北京节点工作正常。\n", "队列已启动 北京", ["<b>队列已启动</b>", "<b>北京</b>"]),
    ("任务队列已启动，北京节点工作正常。\n", "节点工作", ["<b>节点工作</b>"]),
])
def test_a_search_over_megabytes_of_repeated_lines_is_quick_and_marks_the_match(
        store: ConversationStore, line: str, query: str, marked: list[str]) -> None:
    cid = store.create_conversation("Pasted log").id
    log = line * (REPEATED_TEXT_CHARS // len(line))
    store.append_user_message(cid, log + "the disk is full at the very end")
    started = time.monotonic()
    hits = store.search(query)
    assert time.monotonic() - started < GENEROUS_SECONDS
    assert len(hits) == 1
    assert all(mark in hits[0].snippet for mark in marked)
    assert len(hits[0].snippet) < 200
    last = store.search("disk full")[0].snippet
    assert last.startswith("…") and "<b>disk</b> is <b>full</b> at the very end" in last


def test_the_snippet_shows_the_place_where_the_most_terms_meet(store: ConversationStore) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "the harbour " + "and a long road " * 20
                              + "then the harbour lights came on " + "quiet night " * 20)
    snippet = store.search("harbour lights")[0].snippet
    assert "<b>harbour</b> <b>lights</b> came on" in snippet
