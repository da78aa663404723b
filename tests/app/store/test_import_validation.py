"""Import checks the whole document first: a bad field is one error naming its path, and the
database is left exactly as it was."""

import copy
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagoda.app.store import ConversationStore, ImportValidationError, StoreError
from pagoda.app.store.transfer.validation import MAX_NAME_CHARS, MAX_TEXT_CHARS


def dump(store: ConversationStore) -> list[tuple[str, list[tuple]]]:
    """Every row of every table (the search index's included), to show nothing changed."""
    with sqlite3.connect(store.path) as raw:
        query = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        names = [name for (name,) in raw.execute(query)]
        rows = [(name, sorted(raw.execute(f"SELECT * FROM {name}"), key=repr)) for name in names]
    raw.close()
    return rows


def valid_document(tmp_path: Path) -> dict[str, Any]:
    with ConversationStore.open(tmp_path / "source.db") as source:
        source.create_conversation("first")
        cid = source.create_conversation("second", system_prompt="Be brief.").id
        source.append_user_message(cid, "question")
        reply = source.start_assistant_message(cid, model="smollm2")
        source.finish_message(reply.id, "answer", "stop", prompt_tokens=3, completion_tokens=1)
        return json.loads(source.export_json())


def with_value(document: dict[str, Any], path: tuple, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    *parents, last = path
    target = changed
    for key in parents:
        target = target[key]
    target[last] = value
    return changed


@pytest.fixture
def document(tmp_path: Path) -> dict[str, Any]:
    return valid_document(tmp_path)


@pytest.fixture
def used(store: ConversationStore) -> ConversationStore:
    cid = store.create_conversation("already here").id
    store.append_user_message(cid, "kept as it was")
    return store


def refused(store: ConversationStore, text: str) -> StoreError:
    before = dump(store)
    with pytest.raises(StoreError) as caught:
        store.import_json(text)
    assert dump(store) == before
    assert str(caught.value).startswith("not a valid Pagoda export")
    return caught.value


M1 = ("conversations", 1, "messages", 1)
C1 = ("conversations", 1)


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        ((*M1, "role"), "robot", "must be one of 'system', 'user', 'assistant', 'tool', not 'robot'"),
        ((*M1, "status"), "done", "must be one of"),
        ((*M1, "id"), "2", "must be a whole number, not a string"),
        ((*M1, "parent_id"), [1], "must be a whole number or null, not an array"),
        ((*M1, "created_at"), "yesterday", "must be an ISO 8601 time"),
        ((*M1, "created_at"), "2025-01-02T03:04:05", "has no time zone"),
        ((*M1, "created_at"), "0001-01-01T00:00:00+01:00", "is out of range"),
        ((*M1, "stats", "ttft_s"), "fast", "must be a number or null, not 'fast'"),
        ((*M1, "stats"), 3, "must be an object or null"),
        ((*M1, "prompt_tokens"), 1.5, "must be a whole number or null"),
        ((*M1, "prompt_tokens"), True, "must be a whole number or null, not true"),
        ((*M1, "prompt_tokens"), -1, "must be at least 0"),
        ((*M1, "prompt_tokens"), 2**70, "is too large"),
        ((*C1, "pinned"), "yes", "must be true or false"),
        ((*C1, "title"), 7, "must be a string or null, not 7"),
        ((*C1, "sampling"), [], "must be an object"),
        ((*C1, "sampling", "temperature"), "hot", "must be a number"),
        ((*C1, "sampling", "top_k"), 0.5, "must be a whole number"),
        ((*C1, "messages"), {}, "must be an array"),
        ((*C1, "id"), None, "must be a whole number"),
        (("conversations",), {}, "must be an array"),
        (("conversations", 1), "conversation", "must be an object"),
    ],
)
def test_wrongly_typed_field_is_refused_naming_its_path(
    used: ConversationStore, document: dict, path: tuple, value: Any, says: str
) -> None:
    error = refused(used, json.dumps(with_value(document, path, value)))
    where = "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path)
    assert isinstance(error, ImportValidationError) and error.where == where.lstrip(".")
    assert says in str(error)


def test_non_finite_number_is_refused(used: ConversationStore, document: dict) -> None:
    text = json.dumps(with_value(document, (*C1, "sampling", "temperature"), float("nan")))
    assert "must be a finite number" in str(refused(used, text))


@pytest.mark.parametrize(
    ("field", "value"), [("content", None), ("content", 42), ("finish_reason", 1)]
)
def test_null_or_number_for_text_is_refused_not_coerced(
    used: ConversationStore, document: dict, field: str, value: Any
) -> None:
    error = refused(used, json.dumps(with_value(document, (*M1, field), value)))
    assert f"conversations[1].messages[1].{field} must be a string" in str(error)


def test_string_token_count_is_refused_not_stored_as_text(
    used: ConversationStore, document: dict
) -> None:
    error = refused(used, json.dumps(with_value(document, (*M1, "completion_tokens"), "12")))
    assert "conversations[1].messages[1].completion_tokens must be a whole number" in str(error)


def test_missing_field_is_refused(used: ConversationStore, document: dict) -> None:
    del document["conversations"][1]["messages"][0]["role"]
    error = refused(used, json.dumps(document))
    assert "conversations[1].messages[0].role is missing" in str(error)


def test_duplicate_message_id_is_refused_not_replacing_the_first(
    used: ConversationStore, document: dict
) -> None:
    messages = document["conversations"][1]["messages"]
    messages.append({**messages[1], "content": "impostor"})
    error = refused(used, json.dumps(document))
    assert "conversations[1].messages[2].id" in str(error)
    assert "also the id of conversations[1].messages[1]" in str(error)


def test_duplicate_conversation_id_is_refused(used: ConversationStore, document: dict) -> None:
    document["conversations"][0]["id"] = document["conversations"][1]["id"]
    document["conversations"][0]["messages"] = []
    error = refused(used, json.dumps(document))
    assert "conversations[1].id" in str(error) and "also the id of conversations[0]" in str(error)


def test_parent_outside_the_conversation_is_refused(used, document: dict) -> None:
    document["conversations"][1]["messages"][1]["parent_id"] = 999
    error = refused(used, json.dumps(document))
    assert "conversations[1].messages[1].parent_id 999 is not a message of this conversation" in (
        str(error)
    )


def test_leaf_outside_the_conversation_is_refused(used, document: dict) -> None:
    document["conversations"][1]["leaf_id"] = document["conversations"][0]["id"] + 999
    error = refused(used, json.dumps(document))
    assert "conversations[1].leaf_id" in str(error) and "is not a message of this" in str(error)


def test_message_claiming_another_conversation_is_refused(used, document: dict) -> None:
    document["conversations"][1]["messages"][0]["conversation_id"] = 999
    error = refused(used, json.dumps(document))
    assert "conversations[1].messages[0].conversation_id 999 is not this conversation's id" in (
        str(error)
    )


@pytest.mark.parametrize("cycle", ["self", "pair"])
def test_parent_links_that_cycle_are_refused(used, document: dict, cycle: str) -> None:
    first, second = document["conversations"][1]["messages"]
    if cycle == "self":
        second["parent_id"] = second["id"]
    else:
        first["parent_id"] = second["id"]
    error = refused(used, json.dumps(document))
    assert "conversations[1].messages[" in str(error) and "cycle" in str(error)


def test_absurdly_nested_json_is_one_store_error(used: ConversationStore) -> None:
    error = refused(used, "[" * 200_000 + "]" * 200_000)
    assert "nested too deeply" in str(error)


def test_deep_nesting_inside_a_field_is_a_type_error(used, document: dict) -> None:
    nested: Any = "bottom"
    for _ in range(500):  # as deep as json.dumps goes; json.loads reads it without trouble
        nested = [nested]
    text = json.dumps(with_value(document, (*M1, "content"), nested))
    assert "must be a string, not an array" in str(refused(used, text))


def test_long_chain_of_messages_imports_without_recursion(store: ConversationStore) -> None:
    cid = store.create_conversation().id
    for i in range(1500):
        store.append_user_message(cid, f"turn {i}")
    (copy_id,) = store.import_json(store.export_json([cid]))
    path = store.current_path(copy_id)
    assert len(path) == 1500 and path[-1].content == "turn 1499"


def test_bad_second_conversation_leaves_the_first_unimported(used, document: dict) -> None:
    refused(used, json.dumps(with_value(document, (*M1, "role"), "robot")))
    assert [c.title for c in used.list_conversations()] == ["already here"]


def test_lone_surrogates_in_an_import_become_replacement_characters(
    store: ConversationStore, document: dict
) -> None:
    text = json.dumps(with_value(document, (*M1, "content"), "half \ud83d"))
    (_, cid) = store.import_json(text)
    assert store.messages(cid)[1].content == "half \ufffd"


# Refusing a field that is too long takes a parse and a look at its length; importing 20 MB
# took seconds, and 200 MB did not finish.
GENEROUS_SECONDS = 30.0


@pytest.mark.parametrize(("path", "length", "says"), [
    ((*M1, "content"), MAX_TEXT_CHARS + 1, "at most 20,000,000"),
    ((*C1, "system_prompt"), MAX_TEXT_CHARS + 1, "at most 20,000,000"),
    ((*C1, "title"), MAX_NAME_CHARS + 1, "at most 32,767"),
    ((*M1, "finish_reason"), MAX_NAME_CHARS + 1, "at most 32,767"),
    ((*M1, "created_at"), 100_000, "at most 64"),
])
def test_a_field_longer_than_pagoda_writes_is_refused_quickly_in_words(
    used: ConversationStore, document: dict, path: tuple, length: int, says: str
) -> None:
    text = json.dumps(with_value(document, path, "2" * length))
    started = time.monotonic()
    error = refused(used, text)
    assert time.monotonic() - started < GENEROUS_SECONDS
    where = "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path)
    assert error.where == where.lstrip(".")
    assert f"is {length:,} characters long" in str(error) and says in str(error)
    assert len(str(error)) < 300


def test_the_longest_text_imported_is_the_longest_document_pagoda_reads() -> None:
    from pagoda.app.components.documents.document import MAX_TEXT_CHARS as DOCUMENT_CHARS

    assert MAX_TEXT_CHARS == DOCUMENT_CHARS


# -- any document at all -------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(st.characters(codec=None) | st.sampled_from(["\ud800", "\x00", "\udfff"])),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def paths_of(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON document where a value could be replaced."""
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    else:
        children = []
    found = [prefix]
    for key, child in children:
        found += paths_of(child, (*prefix, key))
    return found


def imports_cleanly_or_refuses_cleanly(store: ConversationStore, text: str) -> None:
    before = dump(store)
    try:
        store.import_json(text)
    except StoreError:
        assert dump(store) == before


@pytest.fixture(scope="module")
def sample_document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return valid_document(tmp_path_factory.mktemp("sample"))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=JSON_VALUES)
def test_any_json_value_imports_or_is_one_store_error(used: ConversationStore, value: Any) -> None:
    imports_cleanly_or_refuses_cleanly(used, json.dumps(value))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), value=JSON_VALUES)
def test_a_valid_export_with_any_field_replaced_imports_or_is_one_store_error(
    used: ConversationStore, sample_document: dict, data: st.DataObject, value: Any
) -> None:
    path = data.draw(st.sampled_from(paths_of(sample_document)[1:]))
    imports_cleanly_or_refuses_cleanly(used, json.dumps(with_value(sample_document, path, value)))
