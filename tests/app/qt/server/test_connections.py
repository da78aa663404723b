"""Saved server connections: addresses and models in the database, keys in the keyring (or in
memory when there is none), and asking a server for its models. No Qt."""

import asyncio
import logging
import time
from pathlib import Path

import keyring.errors
import pytest
from fake_keyring import FakeKeyring, LockedKeyring
from fake_server import MODEL
from keyring.backends import fail

from pagoda.app.backends.errors import (
    BackendUnreachableError,
    InvalidAddressError,
    UnauthorizedError,
)
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.connections import (
    CONNECTIONS_SETTING,
    KEYRING_SERVICE,
    AddServerFlow,
    ConnectionKeys,
    SavedConnections,
    ServerConnection,
    backend_for,
    probe_server,
)
from pagoda.app.store import ConversationStore

KEY = "sk-test-7f3a9c1e5b2d4f6a8e0c"


def run(coro, timeout: float = 20):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "pagoda.db"


@pytest.fixture
def open_db(db_path):
    """open_db() -> an AsyncStore on the test's database file; each is closed at the end."""
    opened = []

    def open_() -> AsyncStore:
        db = AsyncStore(ConversationStore.open(db_path))
        opened.append(db)
        return db

    yield open_
    for db in opened:
        db.close()


def test_connections_survive_a_restart(open_db):
    ring = FakeKeyring()
    first = SavedConnections(open_db(), ConnectionKeys(ring))
    run(first.load())
    a = run(first.add("gpu-box:8000", "llama-3-8b", KEY))
    b = run(first.add("http://10.0.0.5:11434/v1", "llama3.2", None))
    first.db.close()

    again = SavedConnections(open_db(), ConnectionKeys(ring))
    run(again.load())
    assert again.list() == [a, b]
    assert a.base_url == "http://gpu-box:8000/v1"
    assert (a.has_key, b.has_key) == (True, False)
    assert again.keys.get(a.id) == KEY
    assert again.keys.get(b.id) is None


def test_api_key_is_in_the_keyring_never_in_the_database(open_db, db_path):
    ring = FakeKeyring()
    saved = SavedConnections(open_db(), ConnectionKeys(ring))
    connection = run(saved.add("http://gpu-box:8000/v1", "llama-3-8b", KEY))
    saved.db.close()

    assert ring.passwords == {(KEYRING_SERVICE, connection.id): KEY}
    written = b"".join(p.read_bytes() for p in db_path.parent.iterdir() if p.is_file())
    assert b"gpu-box:8000" in written
    assert KEY.encode() not in written


def test_without_a_system_keyring_keys_stay_in_memory_and_it_says_so(monkeypatch, open_db):
    monkeypatch.setattr(keyring, "get_keyring", fail.Keyring)
    keys = ConnectionKeys()
    assert not keys.persistent
    assert "kept in memory until Pagoda closes" in keys.notice

    saved = SavedConnections(open_db(), keys)
    connection = run(saved.add("gpu-box:8000", "llama-3-8b", KEY))
    assert keys.get(connection.id) == KEY
    assert ConnectionKeys().get(connection.id) is None


def test_a_keyring_that_fails_when_used_falls_back_to_memory(caplog):
    keys = ConnectionKeys(LockedKeyring())
    assert keys.persistent and keys.notice is None
    with caplog.at_level(logging.WARNING, logger="pagoda.app.components.shared.connections"):
        keys.set("abc", KEY)
    assert not keys.persistent
    assert keys.notice is not None
    assert keys.get("abc") == KEY
    assert KEY not in caplog.text and "KeyringLocked" in caplog.text


def test_removing_a_connection_forgets_it_and_its_key(open_db):
    ring = FakeKeyring()
    saved = SavedConnections(open_db(), ConnectionKeys(ring))
    kept = run(saved.add("a-box:8000", "m1", "sk-a"))
    gone = run(saved.add("b-box:8000", "m2", "sk-b"))
    run(saved.remove(gone.id))

    assert saved.list() == [kept]
    assert saved.get(gone.id) is None
    assert ring.passwords == {(KEYRING_SERVICE, kept.id): "sk-a"}
    again = SavedConnections(saved.db, saved.keys)
    run(again.load())
    assert again.list() == [kept]


def test_the_same_server_and_model_again_is_one_entry_with_the_new_key(open_db):
    saved = SavedConnections(open_db(), ConnectionKeys(FakeKeyring()))
    first = run(saved.add("gpu-box:8000", "llama-3-8b", "sk-old"))
    second = run(saved.add("http://gpu-box:8000/v1/", "llama-3-8b", "sk-new"))
    assert second.id == first.id
    assert saved.list() == [second]
    assert saved.keys.get(second.id) == "sk-new"


def test_a_malformed_setting_is_ignored_with_a_log_line(open_db, caplog):
    db = open_db()
    saved = SavedConnections(db, ConnectionKeys(FakeKeyring()))
    run(db.set_setting(CONNECTIONS_SETTING, {"not": "a list"}))
    with caplog.at_level(logging.WARNING, logger="pagoda.app.components.shared.connections"):
        run(saved.load())
    assert saved.list() == []
    assert CONNECTIONS_SETTING in caplog.text

    good = {"id": "c1", "base_url": "http://gpu-box:8000/v1", "model": "m", "has_key": False}
    bad = [42, {"id": "c2"}, {"id": "c3", "base_url": "ftp://x", "model": "m"},
           {"id": "c4", "base_url": "gpu-box:8000", "model": 7}]
    run(db.set_setting(CONNECTIONS_SETTING, [bad[0], good, *bad[1:]]))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pagoda.app.components.shared.connections"):
        run(saved.load())
    assert saved.list() == [ServerConnection("c1", "http://gpu-box:8000/v1", "m", False)]
    assert caplog.text.count("malformed") == len(bad)


def test_label_names_the_model_then_host_and_port():
    assert ServerConnection("x", "http://gpu-box:8000/v1", "llama-3-8b", False).label == \
        "llama-3-8b · gpu-box:8000"
    assert ServerConnection("x", "https://api.example.com/v1", "gpt", True).label == \
        "gpt · api.example.com:443"


def test_probe_lists_the_servers_models_and_kind(fake_vllm):
    _, url = fake_vllm
    found = run(probe_server(url.removesuffix("/v1"), None))
    assert found.base_url == url
    assert found.models == (MODEL, "other-model")
    assert found.flavor == "vllm"


def test_probe_with_a_wrong_key_says_the_key_was_refused(fake_vllm):
    fake, url = fake_vllm
    fake.api_key = "sk-right"
    with pytest.raises(UnauthorizedError, match="refused the API key"):
        run(probe_server(url, "sk-wrong"))
    assert run(probe_server(url, "sk-right")).models[0] == MODEL


def test_probe_of_an_address_where_nothing_listens_fails_quickly(closed_port):
    start = time.monotonic()
    with pytest.raises(BackendUnreachableError, match=f"127.0.0.1:{closed_port}"):
        run(probe_server(f"127.0.0.1:{closed_port}", None, connect_timeout=2))
    assert time.monotonic() - start < 3


def test_probe_of_something_not_an_address_says_how_to_write_one():
    with pytest.raises(InvalidAddressError, match="http://host:8000/v1"):
        run(probe_server("gpu box:8000", None))


def test_backend_for_a_connection_sends_its_key(fake_vllm, open_db):
    fake, url = fake_vllm
    fake.api_key = "sk-right"
    saved = SavedConnections(open_db(), ConnectionKeys(FakeKeyring()))
    connection = run(saved.add(url, "other-model", "sk-right"))
    backend = backend_for(connection, saved.keys)
    run(backend.connect())
    assert backend.model_name == "other-model"
    assert backend.flavor == "vllm"
    backend.shutdown()


def test_backend_for_a_key_lost_at_restart_says_to_add_the_server_again():
    connection = ServerConnection("gone", "http://gpu-box:8000/v1", "m", has_key=True)
    with pytest.raises(UnauthorizedError, match="add the server again"):
        backend_for(connection, ConnectionKeys(LockedKeyring()))


def test_add_server_flow_probes_then_adds_the_chosen_model(fake_vllm, open_db):
    fake, url = fake_vllm
    fake.api_key = "sk-right"
    flow = AddServerFlow(SavedConnections(open_db(), ConnectionKeys(FakeKeyring())))
    changes = []
    flow.subscribe(lambda: changes.append((flow.busy, flow.models, flow.error)))

    run(flow.probe(url, "sk-wrong"))
    assert "refused the API key" in flow.error
    assert flow.models == () and not flow.can_add

    run(flow.probe(url, " sk-right "))
    assert flow.error is None and flow.models == (MODEL, "other-model")
    assert changes[-2][0] and not changes[-1][0]  # busy while asking, then not
    assert not flow.can_add
    flow.choose("other-model")
    assert flow.can_add

    connection = run(flow.add())
    assert (connection.base_url, connection.model, connection.has_key) == \
        (url, "other-model", True)
    assert flow.saved.list() == [connection]
    assert flow.saved.keys.get(connection.id) == "sk-right"
