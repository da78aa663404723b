"""The model picker: what each model is and needs, opening a model file, refusing one that will
not fit, and the quantization setting. A fake engine stands in for the model; the picker reads
real headers (the bundled GGUF, a tiny safetensors folder)."""

import json
from pathlib import Path

import pytest
import torch
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QLabel, QMessageBox
from safetensors.torch import save_file

from pagoda.app.components.models.model_library import format_size
from pagoda.engine.loading.loader import default_model_file
from tests.app.qt.fake_engine import IdleEngine

RUNNING = "running-model"


class _Loads:
    """The host's factory: records each load's model and EngineConfig. With `available` set,
    runs the host's real memory check against that much memory first."""

    def __init__(self) -> None:
        self.models: list[str | None] = []
        self.configs = []
        self.available: int | None = None

    def __call__(self, model, config, on_progress):
        from pagoda.engine.loading.model_info import check_model_fits

        if self.available is not None:
            check_model_fits(model, config, self.available)
        self.models.append(model)
        self.configs.append(config)
        return IdleEngine(Path(model).name if model else RUNNING)


@pytest.fixture
def picker_window(qloop, qtbot, tmp_path):
    """build() -> (window, loads): a MainWindow over a fake engine, started like the app starts
    (the saved model settings restored, then the default model loaded)."""
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.store import ConversationStore

    windows = []

    def build(db_path=None):
        loads = _Loads()
        store = ConversationStore.open(db_path or tmp_path / "chats.db")
        window = MainWindow(AsyncStore(store), EngineHost(factory=loads))
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        restored = window.spawn(window.models_controller.restore_model_settings())
        qtbot.waitUntil(restored.done, timeout=5000)
        qtbot.waitUntil(window.host.load(None).done, timeout=5000)
        return window, loads

    yield build
    for window in windows:
        if not window.closing:
            window.close()
            window.db.close()


@pytest.fixture
def tiny_folder(tmp_path):
    folder = tmp_path / "tiny-hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"model.embed_tokens.weight": torch.zeros(64, 32, dtype=torch.bfloat16),
               "model.layers.0.mlp.up_proj.weight": torch.zeros(96, 32, dtype=torch.bfloat16)},
              folder / "model.safetensors")
    return folder


def _items(window) -> list[str]:
    picker = window.model_picker
    return [picker.itemText(i) for i in range(picker.count())]


def _wait_described(qtbot, window):
    qtbot.waitUntil(lambda: not any("reading…" in text for text in _items(window)),
                    timeout=30_000)


def _error_box(qtbot, window) -> QMessageBox:
    qtbot.waitUntil(lambda: window.findChild(QMessageBox, "modelErrorDialog") is not None,
                    timeout=30_000)
    return window.findChild(QMessageBox, "modelErrorDialog")


def test_picker_shows_format_quantization_and_the_size_the_models_table_shows(picker_window,
                                                                             qtbot):
    window, _ = picker_window()
    _wait_described(qtbot, window)
    on_disk = format_size(default_model_file().stat().st_size)  # the models table's figure
    assert on_disk == "98.4 MB"
    assert _items(window) == [f"SmolLM2-135M-Instruct (bundled) · GGUF · Q4_1 · {on_disk}",
                              "", "Open model file…", "Get models…",
                              "Add a server…"]
    tooltip = window.model_picker.itemData(0, Qt.ItemDataRole.ToolTipRole)
    assert "135M parameters" in tooltip and str(default_model_file()) in tooltip
    assert f"{on_disk} on disk" in tooltip and "MiB" not in tooltip


def test_picker_shows_memory_under_the_chosen_quantization(picker_window, qtbot):
    window, _ = picker_window()
    _wait_described(qtbot, window)
    box = window.model_settings.quantization_box
    box.setCurrentIndex(box.findData("none"))
    box.activated.emit(box.currentIndex())
    qtbot.waitUntil(lambda: "fp32 (from Q4_1) · 98.4 MB" in _items(window)[0], timeout=5000)
    tooltip = window.model_picker.itemData(0, Qt.ItemDataRole.ToolTipRole)
    assert "fp32 (from Q4_1): 98.4 MB on disk, 538.1 MB of weights in memory" in tooltip


def test_open_model_file_entry_opens_a_dialog_for_gguf_files_and_model_folders(picker_window,
                                                                                qtbot):
    window, _ = picker_window()
    window.models_controller.picked(window.model_picker.findText("Open model file…"))
    dialog = window.findChild(QFileDialog, "modelDialog")
    assert dialog is not None and dialog.isVisible()
    assert any("*.gguf" in f and "config.json" in f for f in dialog.nameFilters())
    dialog.reject()


def test_choosing_a_folders_config_json_loads_the_folder(picker_window, qtbot, tiny_folder):
    window, loads = picker_window()
    dialog = window.models_controller.open_model_dialog()
    dialog.fileSelected.emit(str(tiny_folder / "config.json"))
    dialog.reject()
    qtbot.waitUntil(lambda: window.host.model_path == str(tiny_folder), timeout=5000)
    assert loads.models == [None, str(tiny_folder)]
    qtbot.waitUntil(lambda: any(text.startswith("tiny-hf · safetensors · bf16")
                                for text in _items(window)), timeout=30_000)
    assert window.model_picker.currentText().startswith("tiny-hf")


def test_choosing_a_gguf_file_loads_it(picker_window, qtbot):
    window, loads = picker_window()
    window.models_controller.open_model_file(str(default_model_file()))
    qtbot.waitUntil(lambda: window.host.model_path == str(default_model_file()), timeout=5000)
    assert loads.models == [None, str(default_model_file())]


def test_choosing_something_that_is_not_a_model_says_so_and_loads_nothing(picker_window, qtbot,
                                                                           tmp_path):
    window, loads = picker_window()
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    window.models_controller.open_model_file(str(notes))
    assert "notes.txt is not a model" in _error_box(qtbot, window).text()
    assert loads.models == [None] and not window.host.is_loading


def test_a_model_too_large_for_memory_is_refused_and_the_running_one_stays(picker_window,
                                                                            qtbot):
    window, loads = picker_window()
    running = window.host.backend
    loads.available = 64 << 20
    window.models_controller.open_model_file(str(default_model_file()))
    message = _error_box(qtbot, window).text()
    assert "SmolLM2-135M-Instruct" in message and "only 0.1 GiB is available" in message
    assert "int4" in message and "smaller" in message
    assert window.host.backend is running and not running.engine.stopped
    assert window.host.model_path is None and window.host.status.state == "ready"
    assert window.host.model_name == RUNNING
    assert loads.models == [None]


def test_quantization_setting_reaches_the_next_engine_config(picker_window, qtbot):
    window, loads = picker_window()
    assert loads.configs[0].quantization == "auto"
    box = window.model_settings.quantization_box
    box.setCurrentIndex(box.findData("int4"))
    box.activated.emit(box.currentIndex())
    assert loads.configs[-1].quantization == "auto"  # nothing reloads by itself
    window.models_controller.picked(0)  # the running model, picked again
    qtbot.waitUntil(lambda: window.host.loaded_quantization == "int4", timeout=5000)
    assert [c.quantization for c in loads.configs] == ["auto", "int4"]


def test_quantization_setting_is_kept_for_the_next_start(picker_window, qtbot, tmp_path):
    window, _ = picker_window(tmp_path / "kept.db")
    box = window.model_settings.quantization_box
    box.setCurrentIndex(box.findData("int8"))
    box.activated.emit(box.currentIndex())
    qtbot.waitUntil(lambda: window.db.store.get_setting("quantization") == "int8", timeout=5000)
    window.close()
    window.db.close()
    again, loads = picker_window(tmp_path / "kept.db")
    assert again.model_settings.quantization() == "int8"
    assert loads.configs[0].quantization == "int8"


def test_the_quantization_setting_says_it_applies_on_the_next_load(qtbot):
    from pagoda.app.qt.models.model_settings import ModelSettingsPanel

    panel = ModelSettingsPanel()
    qtbot.addWidget(panel)
    note = panel.findChild(QLabel, "quantizationNote")
    assert "next time a model loads" in note.text()
    assert [panel.quantization_box.itemData(i) for i in range(panel.quantization_box.count())] \
        == ["auto", "none", "int8", "int4"]
    received = []
    panel.quantization_changed.connect(received.append)
    panel.set_quantization("int4")
    assert panel.quantization() == "int4" and received == []


def test_the_hosts_own_loader_checks_memory_before_reading_any_weights(qloop, qtbot,
                                                                        monkeypatch):
    from pagoda.app.qt.models.engine_host import EngineHost

    def must_not_load(*args, **kwargs):
        raise AssertionError("the weights were read although the model cannot fit")

    monkeypatch.setattr("pagoda.engine.loading.loader.load_model", must_not_load)
    monkeypatch.setattr("pagoda.engine.loading.model_info.available_memory", lambda: 64 << 20)
    host = EngineHost()
    with qtbot.waitSignal(host.load_failed, timeout=30_000) as failed:
        host.load(str(default_model_file()))
    assert "only 0.1 GiB is available" in failed.args[0]
    assert host.backend is None and host.status.state == "error"
    host.shutdown()
