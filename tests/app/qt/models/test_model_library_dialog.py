""""Get models…" in the window, against a fake Hub on 127.0.0.1 and a fake engine: the dialog
opens from the model picker, shows what the Hub has, and a finished download joins the picker
and loads at once."""

import threading

from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import QLabel, QPushButton

from pagoda.app.components.models.model_library import (
    HUB_TOKEN_ID,
    FileChoice,
    ModelLibrary,
    Recommendation,
)
from pagoda.app.qt.models.model_library_dialog import DownloadRow, ModelLibraryDialog
from pagoda.app.qt.models.models_controller import GET_MODELS_ITEM
from tests.conftest import LIBRARY_FILES, LIBRARY_REPO
from tests.engine.fake_hub import TOKEN

Q4 = "tiny-Q4_K_M.gguf"


def _open_from_picker(window) -> ModelLibraryDialog:
    picker = window.model_picker
    window.models_controller.picked(picker.findData(GET_MODELS_ITEM))
    return window.findChild(ModelLibraryDialog, "modelLibraryDialog")


def _search(qtbot, dialog: ModelLibraryDialog, query: str) -> None:
    qtbot.keyClicks(dialog.query, query)
    qtbot.mouseClick(dialog.search_button, Qt.MouseButton.LeftButton)


def test_get_models_in_the_picker_opens_the_library(library_hub, window_on, tmp_path):
    window = window_on(tmp_path / "chats.db")

    assert window.model_picker.findText("Get models…") >= 0
    dialog = _open_from_picker(window)

    assert dialog is not None and dialog.isVisible()
    assert window.models_controller.open_model_library() is dialog  # one dialog, shown again


def test_a_search_shows_the_hubs_models_and_a_repository_its_files(library_hub, window_on,
                                                                   tmp_path, qtbot):
    dialog = _open_from_picker(window_on(tmp_path / "chats.db"))
    _search(qtbot, dialog, "tiny")

    qtbot.waitUntil(lambda: dialog.results.count() == 2, timeout=10_000)
    assert dialog.results.item(1).text().startswith(LIBRARY_REPO)
    dialog.results.setCurrentRow(1)
    qtbot.waitUntil(lambda: dialog.files.topLevelItemCount() == 2, timeout=10_000)
    chosen = dialog.files.currentItem()
    assert [chosen.text(c) for c in (0, 1, 2, 5)] == [Q4, "Q4_K_M", "307.2 kB", "recommended"]
    assert chosen.text(4) in {"fits", "tight", "too big"} and chosen.toolTip(4)
    assert dialog.download_button.isEnabled()


def test_an_unreachable_hub_is_said_in_the_status_line(library_hub, window_on, tmp_path, qtbot,
                                                       monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dialog = _open_from_picker(window_on(tmp_path / "chats.db"))
    _search(qtbot, dialog, "tiny")

    status = dialog.findChild(QLabel, "hubStatus")
    qtbot.waitUntil(lambda: status.text().startswith("Offline mode is on"), timeout=10_000)
    assert dialog.results.item(0).text().startswith("Small: ")  # the recommendations stay


def test_a_search_shows_that_it_is_searching_until_its_error_comes(library_hub, window_on,
                                                                   tmp_path, qtbot, monkeypatch):
    from pagoda.app.components.models import model_library

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    release, search = threading.Event(), model_library._search
    monkeypatch.setattr(model_library, "_search",
                        lambda query, token: (release.wait(10), search(query, token))[1])
    dialog = _open_from_picker(window_on(tmp_path / "chats.db"))
    release.set()
    _search(qtbot, dialog, "tiny")
    qtbot.waitUntil(lambda: dialog.status_line.text().startswith("Offline mode is on"),
                    timeout=10_000)
    assert not dialog.is_busy() and dialog.status_line.property("error")
    release.clear()

    _search(qtbot, dialog, " again")
    qtbot.waitUntil(dialog.is_busy, timeout=10_000)
    assert dialog.status_line.text() == "Searching the Hugging Face Hub for 'tiny again'…"
    assert not dialog.status_line.property("error")  # not in the last error's red
    release.set()
    qtbot.waitUntil(lambda: not dialog.is_busy(), timeout=10_000)
    assert dialog.status_line.text().startswith("Offline mode is on")


def test_a_finished_download_joins_the_picker_and_loads_at_once(library_hub, window_on,
                                                                tmp_path, qtbot):
    window = window_on(tmp_path / "chats.db")
    dialog = _open_from_picker(window)
    _search(qtbot, dialog, "tiny-GGUF")
    qtbot.waitUntil(lambda: dialog.results.count() == 1, timeout=10_000)
    dialog.results.setCurrentRow(0)
    qtbot.waitUntil(lambda: dialog.download_button.isEnabled(), timeout=10_000)

    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)

    path = tmp_path / "models" / "pagoda-test" / "tiny-GGUF" / Q4
    qtbot.waitUntil(lambda: window.model_picker.findData(str(path)) >= 0, timeout=10_000)
    assert path.read_bytes() == LIBRARY_FILES[Q4]
    row = dialog.findChild(DownloadRow, "downloadRow")
    load = row.findChild(QPushButton, "loadDownloadButton")
    assert row.bar.value() == row.bar.maximum() and not row.cancel_button.isVisibleTo(row)
    qtbot.mouseClick(load, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.host.model_path == str(path), timeout=10_000)


def test_the_recommended_models_are_listed_at_open_and_list_their_files(
        library_hub, window_on, tmp_path, qtbot, monkeypatch):
    monkeypatch.setattr("pagoda.app.components.models.model_library.RECOMMENDED_MODELS",
                        (Recommendation("Small", "Tiny", LIBRARY_REPO, "a test model"),))
    dialog = _open_from_picker(window_on(tmp_path / "chats.db"))

    assert dialog.results.item(0).text() == f"Small: Tiny\n{LIBRARY_REPO} · a test model"
    dialog.results.setCurrentRow(0)
    qtbot.waitUntil(lambda: dialog.files.topLevelItemCount() == 2, timeout=10_000)


def test_the_recommendations_are_shown_whole_not_cut_at_the_lists_edge(window_on, tmp_path,
                                                                      qtbot):
    dialog = _open_from_picker(window_on(tmp_path / "chats.db"))
    qtbot.waitExposed(dialog)
    results = dialog.results

    def cut_rows() -> list[str]:
        width = results.viewport().width()
        cut = []
        for row in range(results.count()):
            item = results.item(row)
            wrapped = results.fontMetrics().boundingRect(
                QRect(0, 0, width, 10_000), Qt.TextFlag.TextWordWrap, item.text())
            if results.visualItemRect(item).height() < wrapped.height():
                cut.append(item.text())
        return cut

    # The list lays its rows out again after the dialog's last resize, a moment after it shows.
    qtbot.waitUntil(lambda: results.count() > 0 and not cut_rows(), timeout=3000)


def test_a_token_saved_in_the_dialog_goes_to_the_keyring_never_to_the_chats_database(
        library_hub, window_on, tmp_path, qtbot):
    window = window_on(tmp_path / "chats.db")
    dialog = _open_from_picker(window)
    qtbot.keyClicks(dialog.token, TOKEN)
    qtbot.mouseClick(dialog.save_token_button, Qt.MouseButton.LeftButton)

    assert dialog.token.text() == "" and dialog.forget_token_button.isVisibleTo(dialog)
    assert window.model_library.keys.get(HUB_TOKEN_ID) == TOKEN
    assert "kept in memory" in dialog.token_status.text()  # the tests' keyring: none
    for path in tmp_path.glob("chats.db*"):
        assert TOKEN.encode() not in path.read_bytes()

    qtbot.mouseClick(dialog.forget_token_button, Qt.MouseButton.LeftButton)
    assert not window.model_library.has_token
    assert not dialog.forget_token_button.isVisibleTo(dialog)


def test_the_models_on_this_computer_are_a_tab_of_the_dialog_and_load_from_it(
        library_hub, window_on, tmp_path, qtbot):
    path = tmp_path / "models" / "someone" / "tiny-GGUF" / "tiny-Q8_0.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(LIBRARY_FILES["tiny-Q8_0.gguf"])
    window = window_on(tmp_path / "chats.db")
    dialog = _open_from_picker(window)

    assert [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())] == [
        "Hugging Face Hub", "On this computer"]
    panel = dialog.local_panel
    # The downloaded model, and the bundled one.
    qtbot.waitUntil(lambda: panel.table.topLevelItemCount() == 2, timeout=10_000)
    panel.select(path)
    qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.host.model_path == str(path), timeout=10_000)


def test_a_model_the_engine_does_not_run_is_shown_greyed_with_the_reason_and_not_downloadable(
        library_hub, window_on, tmp_path, qtbot):
    dialog = _open_from_picker(window_on(tmp_path / "chats.db"))
    _search(qtbot, dialog, "moe-GGUF")

    qtbot.waitUntil(lambda: dialog.results.count() == 1, timeout=10_000)
    result = dialog.results.item(0)
    assert result.text().endswith("Does not run in Pagoda: mixture-of-experts: not yet")
    assert "mixture-of-experts: not yet" in result.toolTip()
    dialog.results.setCurrentRow(0)
    qtbot.waitUntil(lambda: dialog.files.topLevelItemCount() == 1, timeout=10_000)
    row = dialog.files.topLevelItem(0)
    assert row.isDisabled() and row.text(5) == "does not run: mixture-of-experts: not yet"
    assert "Pagoda does not run" in dialog.status_line.text()
    dialog.files.setCurrentItem(row)
    assert not dialog.download_button.isEnabled()


def test_a_files_parameters_have_a_column_of_their_own(qloop, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the choice's own listing answers at once
    library = ModelLibrary(tmp_path / "models")
    dialog = ModelLibraryDialog(library, lambda path: None)
    qtbot.addWidget(dialog)
    dialog.show_recommended()
    dialog.results.setCurrentRow(0)
    repo_id = dialog.results.item(0).data(Qt.ItemDataRole.UserRole)

    dialog.show_files(repo_id, [FileChoice("m-Q4_K_M.gguf", "Q4_K_M", 18_556_685_024, True,
                                           "fits", "Needs about 19.6 GB", "fits",
                                           parameters="30.5B, 3.4B active")])

    row = dialog.files.topLevelItem(0)
    header = dialog.files.headerItem()
    columns = {header.text(c): row.text(c) for c in range(dialog.files.columnCount())}
    assert columns["Parameters"] == "30.5B, 3.4B active"
    assert columns["Memory"] == "fits" and columns["Size"] == "18.6 GB"
    qtbot.waitUntil(lambda: not dialog.is_busy(), timeout=10_000)
    library.close()
