"""The models folder in the window: a setting ("Change…") kept across restarts that decides where
downloads go and what "On this computer" lists; the picker offers the folder's most recently
used models; loading one notes when. A fake engine loads the tiny stand-in files."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox

from pagoda.app.qt.models.local_models_panel import LocalModelsPanel
from pagoda.app.qt.models.models_folder_settings import MODELS_FOLDER_SETTING
from tests.conftest import LIBRARY_FILES, LIBRARY_REPO, runnable_gguf_bytes

Q4 = "tiny-Q4_K_M.gguf"


def default_folder() -> Path:
    return Path(os.environ["PAGODA_MODELS_DIR"])


def a_model(folder: Path, name: str) -> Path:
    path = folder / "owner" / "repo" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(runnable_gguf_bytes(128))
    return path


def restored(window_on, tmp_path, run_async):
    window = window_on(tmp_path / "chats.db")
    run_async(window.models_controller.restore_model_settings())
    run_async(window.local_models.wait_idle())  # the folder is listed in the background
    return window


def choose_folder(window, qtbot, folder: Path) -> None:
    qtbot.mouseClick(window.model_settings.change_models_folder_button,
                     Qt.MouseButton.LeftButton)
    dialog = window.model_settings.findChild(QFileDialog, "modelsFolderDialog")
    assert dialog is not None and dialog.isVisible()
    dialog.fileSelected.emit(str(folder))
    dialog.reject()


def picker_paths(window) -> list[str]:
    picker = window.model_picker
    return [picker.itemData(i) for i in range(picker.count()) if picker.itemData(i)]


def test_without_a_choice_models_go_to_the_default_folder(window_on, tmp_path, run_async):
    window = restored(window_on, tmp_path, run_async)

    assert window.model_library.dest_dir == default_folder()
    assert window.local_models.folder == default_folder()
    assert window.model_settings.models_folder.text() == str(default_folder())


def test_a_chosen_folder_takes_the_downloads_and_is_kept_for_the_next_start(
        library_hub, window_on, tmp_path, run_async, qtbot):
    window = restored(window_on, tmp_path, run_async)
    chosen = tmp_path / "big disk" / "models"

    choose_folder(window, qtbot, chosen)

    assert window.model_settings.models_folder.text() == str(chosen)
    qtbot.waitUntil(lambda: window.db.store.get_setting(MODELS_FOLDER_SETTING) == str(chosen))
    window.model_library.download(LIBRARY_REPO, Q4)
    path = chosen / "pagoda-test" / "tiny-GGUF" / Q4
    qtbot.waitUntil(lambda: [m.path for m in window.local_models.listing.folder_models] == [path],
                    timeout=10_000)
    assert path.read_bytes() == LIBRARY_FILES[Q4]
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock

    again = restored(window_on, tmp_path, run_async)  # $PAGODA_MODELS_DIR is still set
    assert again.model_library.dest_dir == chosen
    assert [m.path for m in again.local_models.listing.folder_models] == [path]
    assert str(path) in picker_paths(again)


def test_the_picker_offers_the_folders_models_the_last_loaded_first(window_on, tmp_path,
                                                                    run_async, qtbot):
    models = [a_model(default_folder(), f"m{i}-Q4_K_M.gguf") for i in range(10)]
    window = restored(window_on, tmp_path, run_async)

    offered = [p for p in picker_paths(window) if p.startswith(str(default_folder()))]
    assert len(offered) == 8  # the picker stays short

    window.models_controller.load_model(str(models[9]))
    qtbot.waitUntil(lambda: window.host.model_path == str(models[9]), timeout=10_000)
    qtbot.waitUntil(lambda: window.local_models.listing.folder_models[0].last_used is not None,
                    timeout=10_000)
    assert window.local_models.recent(1) == [models[9]]
    assert picker_paths(window)[0] == str(models[9])  # the running model, before the others
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock

    again = restored(window_on, tmp_path, run_async)
    assert again.local_models.listing.folder_models[0].path == models[9]
    assert again.local_models.listing.folder_models[0].last_used is not None


def test_the_panel_loads_into_the_window_and_will_not_delete_the_running_model(
        window_on, tmp_path, run_async, qtbot):
    model = a_model(default_folder(), "tiny-Q8_0.gguf")
    window = restored(window_on, tmp_path, run_async)
    panel = LocalModelsPanel(window.local_models, lambda path: window.models_controller.load_model(str(path)))
    qtbot.addWidget(panel)

    panel.select(model)
    qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.host.model_path == str(model), timeout=10_000)
    panel.select(model)
    panel.confirm_delete().button(QMessageBox.StandardButton.Yes).click()

    qtbot.waitUntil(lambda: panel.status_line.text().startswith("tiny is the model running now"),
                    timeout=5_000)
    assert model.exists()
