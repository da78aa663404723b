"""A database Pagoda cannot use at start: the user is told why, and picks another file or quits."""

import sqlite3

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit, QMessageBox

from pagoda.app import bootstrap
from pagoda.app import main as app_main
from pagoda.app.open_store import open_store
from pagoda.app.qt.conversations import database_dialog
from pagoda.app.qt.conversations.database_dialog import (
    CHOOSE,
    QUIT,
    ask_for_another_database,
    database_error_box,
)
from pagoda.app.store import ConversationStore, DatabaseTooNewError, StoreError


def _written_by_a_newer_pagoda(path):
    """A real database whose schema revision this version does not know."""
    ConversationStore.open(path).close()
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'from_the_future'")
    connection.close()
    return path


class _Asker:
    """Stands in for the dialog: records each error and answers from a list of paths."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.errors = []

    def __call__(self, error):
        self.errors.append(error)
        return self.answers.pop(0)


def test_an_unusable_database_is_explained_and_the_chosen_file_opens(tmp_path):
    bad = _written_by_a_newer_pagoda(tmp_path / "new.db")
    asker = _Asker(tmp_path / "chosen.db")
    store = open_store(bad, asker)
    try:
        assert store.path == tmp_path / "chosen.db"
    finally:
        store.close()
    [error] = asker.errors
    assert isinstance(error, DatabaseTooNewError) and str(bad) in str(error)


def test_the_user_is_asked_again_until_a_file_opens(tmp_path):
    first = _written_by_a_newer_pagoda(tmp_path / "first.db")
    second = _written_by_a_newer_pagoda(tmp_path / "second.db")
    asker = _Asker(second, tmp_path / "third.db")
    store = open_store(first, asker)
    store.close()
    assert store.path == tmp_path / "third.db"
    assert [str(second) in str(e) for e in asker.errors] == [False, True]


def test_any_store_error_is_asked_about(tmp_path, monkeypatch):
    real_open = ConversationStore.open
    tried = []

    def open_once_refused(path=None):
        tried.append(path)
        if len(tried) == 1:
            raise StoreError(f"Pagoda cannot use the database {path}: a test said so.")
        return real_open(path)

    monkeypatch.setattr(ConversationStore, "open", open_once_refused)
    asker = _Asker(tmp_path / "other.db")
    open_store(tmp_path / "refused.db", asker).close()
    assert tried == [tmp_path / "refused.db", tmp_path / "other.db"]
    assert "a test said so" in str(asker.errors[0])


def test_quitting_raises_the_last_error(tmp_path):
    bad = _written_by_a_newer_pagoda(tmp_path / "new.db")
    with pytest.raises(DatabaseTooNewError):
        open_store(bad, _Asker(None))


def test_quitting_at_start_exits_non_zero_with_the_reason_and_no_traceback(qapp, tmp_path,
                                                                         monkeypatch, capsys):
    bad = _written_by_a_newer_pagoda(tmp_path / "new.db")
    monkeypatch.setattr(bootstrap, "style_app", lambda app, theme: None)
    monkeypatch.setattr(database_dialog, "ask_for_another_database", _Asker(None))
    status = app_main.main(["--db", str(bad)])
    err = capsys.readouterr().err
    assert status != 0
    assert "pagoda: no conversation database, quitting." in err and str(bad) in err
    assert "Traceback" not in err


def test_the_dialog_shows_the_error_and_offers_another_file_or_quit(qtbot, tmp_path):
    error = DatabaseTooNewError(tmp_path / "new.db", "from_the_future", "0007")
    box = database_error_box(error)
    qtbot.addWidget(box)
    assert box.objectName() == "databaseErrorDialog"
    assert box.text() == str(error)
    assert sorted(b.text() for b in box.buttons()) == sorted([CHOOSE, QUIT])
    assert box.defaultButton().text() == CHOOSE


def _answer_modals(*steps):
    """Run each step on the next modal dialog as soon as it is shown."""
    pending = list(steps)

    def poll():
        modal = QApplication.activeModalWidget()
        if modal is not None and pending:
            pending.pop(0)(modal)
        if pending:
            QTimer.singleShot(20, poll)

    QTimer.singleShot(20, poll)


def _click(text):
    def step(box):
        assert isinstance(box, QMessageBox)
        next(b for b in box.buttons() if b.text() == text).click()
    return step


def _pick(path):
    def step(dialog):
        assert isinstance(dialog, QFileDialog) and dialog.objectName() == "databaseFileDialog"
        dialog.findChild(QLineEdit, "fileNameEdit").setText(str(path))
        dialog.accept()
    return step


def test_choosing_another_file_in_the_dialog_returns_the_file_picked(qapp, tmp_path):
    error = StoreError("Pagoda cannot use the database /nowhere/pagoda.db: a test said so.")
    _answer_modals(_click(CHOOSE), _pick(tmp_path / "mine.db"))
    assert ask_for_another_database(error) == tmp_path / "mine.db"


def test_quit_in_the_dialog_means_quit(qapp):
    _answer_modals(_click(QUIT))
    assert ask_for_another_database(StoreError("unusable")) is None
