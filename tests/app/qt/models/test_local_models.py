"""The models on this computer: the models folder listed across runs (GGUF files and safetensors
folders, unfinished downloads apart), when each model was last loaded, deleting one (never the
running one), the bundled model and the models opened from elsewhere (remembered, forgotten,
never deleted), and the "On this computer" panel over it. Tiny files stand in for models: nothing
here loads or reads one, nor contacts the Hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QMessageBox

from pagoda.app.components.models.local_models import (
    BUNDLED,
    GGUF,
    LAST_USED_FILE,
    OUTSIDE,
    PARTIAL,
    SAFETENSORS,
    LocalModels,
    format_last_used,
)
from pagoda.app.components.models.opened_models import MAX_REMEMBERED, OPENED_FILE, OpenedModels
from pagoda.app.qt.models.local_models_panel import LocalModelsPanel

DAY = 86400.0


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    """Two GGUF files (one with an unfinished newer download beside it), a safetensors model
    folder, two model folders still coming (config.json comes last), and a lone unfinished
    file."""
    root = tmp_path / "models"
    write(root / "owner" / "tiny-GGUF" / "tiny-Q4_K_M.gguf", 4000)
    write(root / "owner" / "tiny-GGUF" / "tiny-Q4_K_M.gguf.0123456789ab.incomplete", 700)
    write(root / "owner" / "tiny-GGUF" / "tiny-Q8_0.gguf", 8000)
    hf = root / "owner" / "tiny-hf"
    write(hf / "model.safetensors", 3000)
    (hf / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    write(root / "owner" / "coming" / "model.safetensors", 500)
    write(root / "owner" / "starting" / "tokenizer.json", 100)
    write(root / "owner" / "starting" / "model.safetensors.0123456789ab.incomplete", 200)
    write(root / "other" / "big-GGUF" / "big-Q6_K.gguf.fedcba987654.incomplete", 900)
    return root


@pytest.fixture
def make_library(qloop, run_async):
    libraries = []

    def build(folder: Path, **kwargs) -> LocalModels:
        library = LocalModels(folder, **kwargs)
        run_async(library.refresh())
        libraries.append(library)
        return library

    yield build
    for library in libraries:
        library.close()


def rows(library: LocalModels) -> list[tuple]:
    return [(e.name, e.format, e.quantization, e.size) for e in library.listing.entries]


def test_the_folder_lists_its_models_and_unfinished_downloads_apart(folder, make_library):
    library = make_library(folder)

    assert rows(library) == [
        ("tiny", GGUF, "Q4_K_M", 4000),
        ("tiny", GGUF, "Q8_0", 8000),
        ("tiny-hf", SAFETENSORS, "BF16", 3000 + len('{"torch_dtype": "bfloat16"}')),
        ("big-Q6_K.gguf", PARTIAL, "Q6_K", 900),
        ("coming", PARTIAL, "", 500),
        ("starting", PARTIAL, "", 300),
        ("tiny-Q4_K_M.gguf", PARTIAL, "Q4_K_M", 700),
    ]
    assert len(library.listing.models) == 3
    assert library.listing.total_bytes == sum(row[3] for row in rows(library))


def test_a_vision_tower_beside_its_model_is_not_listed_as_a_model(folder, make_library):
    """An mmproj file is loaded with the model beside it (pagoda.engine.loading.model_files)."""
    write(folder / "owner" / "tiny-GGUF" / "mmproj-tiny-f16.gguf", 600)
    assert [row[:3] for row in rows(make_library(folder))][:2] == [("tiny", GGUF, "Q4_K_M"),
                                                                   ("tiny", GGUF, "Q8_0")]
    assert len(make_library(folder).listing.models) == 3


def test_a_folder_not_made_yet_lists_nothing(tmp_path, make_library):
    library = make_library(tmp_path / "nowhere")

    assert library.listing.entries == () and not library.listing.exists


def test_when_a_model_was_last_used_is_kept_across_a_restart(folder, make_library, run_async):
    clock = Clock()
    library = make_library(folder, clock=clock)
    q8 = folder / "owner" / "tiny-GGUF" / "tiny-Q8_0.gguf"
    hf = folder / "owner" / "tiny-hf"

    run_async(library.record_use(str(q8)))
    clock.now += DAY
    run_async(library.record_use(str(hf)))
    library.close()
    again = make_library(folder)

    used = {e.path: e.last_used for e in again.listing.models}
    assert used[hf] == clock.now and used[q8] == clock.now - DAY
    assert used[folder / "owner" / "tiny-GGUF" / "tiny-Q4_K_M.gguf"] is None
    assert again.recent(2) == [hf, q8]  # the most recently used first
    assert again.listing.entries[0].path == hf


def test_a_model_outside_the_folder_is_not_noted(folder, make_library, tmp_path):
    library = make_library(folder)

    assert library.record_use(str(write(tmp_path / "elsewhere.gguf", 10))) is None
    assert library.record_use(None) is None
    assert not (folder / LAST_USED_FILE).exists()


def test_a_damaged_last_used_file_is_ignored_and_replaced_whole(folder, make_library,
                                                                 run_async):
    (folder / LAST_USED_FILE).write_text('{"owner/tiny-hf": 12')  # a crash of another writer
    library = make_library(folder)
    assert all(e.last_used is None for e in library.listing.models)

    run_async(library.record_use(str(folder / "owner" / "tiny-hf")))

    assert json.loads((folder / LAST_USED_FILE).read_text()).keys() == {"owner/tiny-hf"}
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


def test_delete_removes_a_gguf_file_with_its_partials_and_frees_their_bytes(folder,
                                                                            make_library,
                                                                            run_async):
    library = make_library(folder)
    q4 = next(e for e in library.listing.models if e.quantization == "Q4_K_M")

    assert run_async(library.delete(q4)) == 4000 + 700

    assert not q4.path.exists()
    assert ("tiny-Q4_K_M.gguf", PARTIAL, "Q4_K_M", 700) not in rows(library)
    assert (folder / "owner" / "tiny-GGUF" / "tiny-Q8_0.gguf").exists()


def test_deleting_a_repositorys_last_model_removes_its_empty_folders(folder, make_library,
                                                                     run_async):
    library = make_library(folder)
    partial = next(e for e in library.listing.partials if e.name == "big-Q6_K.gguf")

    assert run_async(library.delete(partial)) == 900

    assert not (folder / "other").exists() and folder.is_dir()


def test_delete_refuses_the_model_running_now(folder, make_library, run_async):
    statuses = []
    hf = folder / "owner" / "tiny-hf"
    library = make_library(folder, loaded_model=lambda: str(hf))
    library.attach(Recorder(statuses))

    entry = next(e for e in library.listing.models if e.path == hf)
    assert run_async(library.delete(entry)) == 0

    assert hf.is_dir()
    refusal = "tiny-hf is the model running now: load another model first, then delete this one."
    assert statuses[-1] == (refusal, True)


def test_delete_refuses_what_a_download_is_writing_now(folder, make_library, run_async):
    statuses = []
    library = make_library(folder, downloading=lambda: [folder / "other" / "big-GGUF"])
    library.attach(Recorder(statuses))

    entry = next(e for e in library.listing.partials if e.name.startswith("big"))
    assert run_async(library.delete(entry)) == 0

    assert entry.path.exists()
    assert statuses[-1][1] and "is being downloaded now: cancel its download first" in \
        statuses[-1][0]


def test_a_delete_the_system_refuses_is_said_in_a_sentence(folder, make_library, run_async,
                                                           monkeypatch):
    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("pagoda.app.components.models.local_models.shutil.rmtree", refuse)
    statuses = []
    library = make_library(folder)
    library.attach(Recorder(statuses))
    hf = next(e for e in library.listing.models if e.format == SAFETENSORS)

    assert run_async(library.delete(hf)) == 0

    text, error = statuses[-1]
    assert error and text.startswith(f"Could not delete {hf.path}: permission denied.")
    assert hf.path.is_dir()


def test_last_used_reads_as_people_say_it():
    now = 1_700_000_000.0
    assert format_last_used(None, now) == "never"
    assert format_last_used(now - 5, now) == "just now"
    assert format_last_used(now - 300, now) == "5 min ago"
    assert format_last_used(now - 3 * 3600, now) == "3 h ago"
    assert format_last_used(now - DAY - 10, now) == "yesterday"
    assert format_last_used(now - 12 * DAY, now) == "12 days ago"


class Recorder:
    def __init__(self, statuses: list) -> None:
        self.statuses = statuses

    def show_listing(self, listing) -> None: ...

    def show_status(self, text: str, error: bool = False) -> None:
        self.statuses.append((text, error))


# -- the panel -----------------------------------------------------------------------------------

@pytest.fixture
def make_panel(qtbot, make_library):
    def build(folder: Path, **kwargs):
        loads: list[Path] = []
        panel = LocalModelsPanel(make_library(folder, **kwargs), loads.append)
        qtbot.addWidget(panel)
        panel.show()
        return panel, loads

    return build


def table(panel: LocalModelsPanel) -> list[list[str]]:
    t = panel.table
    return [[t.topLevelItem(i).text(c) for c in range(t.columnCount())]
            for i in range(t.topLevelItemCount())]


def test_the_panel_lists_the_models_and_where_the_folder_is(folder, make_panel):
    panel, _ = make_panel(folder)

    assert table(panel)[:3] == [["tiny", "GGUF", "Q4_K_M", "4.0 kB", "never"],
                                ["tiny", "GGUF", "Q8_0", "8.0 kB", "never"],
                                ["tiny-hf", "safetensors", "BF16", "3.0 kB", "never"]]
    assert table(panel)[4] == ["coming", "partial download", "", "500 B", ""]
    assert panel.where.text() == (f"Models folder: {folder} · 3 models, 4 unfinished "
                                  "downloads, 17.4 kB in all")


def test_load_hands_the_chosen_model_over_and_a_partial_cannot_be_loaded(folder, make_panel,
                                                                         qtbot):
    panel, loads = make_panel(folder)
    q8 = folder / "owner" / "tiny-GGUF" / "tiny-Q8_0.gguf"

    panel.select(q8)
    qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
    assert loads == [q8]
    panel.select(folder / "owner" / "coming")
    assert not panel.load_button.isEnabled() and panel.delete_button.isEnabled()


def test_show_in_folder_opens_the_folder_that_holds_the_model(folder, make_panel, qtbot,
                                                              monkeypatch):
    opened: list[QUrl] = []
    monkeypatch.setattr("pagoda.app.qt.models.local_models_panel.QDesktopServices.openUrl",
                        opened.append)
    panel, _ = make_panel(folder)

    qtbot.mouseClick(panel.show_button, Qt.MouseButton.LeftButton)  # nothing chosen yet
    panel.select(folder / "owner" / "tiny-GGUF" / "tiny-Q8_0.gguf")
    qtbot.mouseClick(panel.show_button, Qt.MouseButton.LeftButton)
    panel.select(folder / "owner" / "tiny-hf")
    qtbot.mouseClick(panel.show_button, Qt.MouseButton.LeftButton)

    assert [url.toLocalFile() for url in opened] == [
        str(folder), str(folder / "owner" / "tiny-GGUF"), str(folder / "owner" / "tiny-hf")]


def test_delete_asks_first_and_only_yes_deletes(folder, make_panel, qtbot):
    panel, _ = make_panel(folder)
    q8 = folder / "owner" / "tiny-GGUF" / "tiny-Q8_0.gguf"
    panel.select(q8)

    box = panel.confirm_delete()
    assert box.objectName() == "deleteLocalModelDialog" and "tiny" in box.text()
    box.button(QMessageBox.StandardButton.Cancel).click()
    assert q8.exists()

    panel.confirm_delete().button(QMessageBox.StandardButton.Yes).click()

    qtbot.waitUntil(lambda: not q8.exists() and len(table(panel)) == 6, timeout=5_000)
    assert panel.status_line.text() == "Deleted tiny: 8.0 kB freed."


def test_the_panel_reads_the_folder_as_it_opens(folder, qloop, qtbot):
    library = LocalModels(folder)  # never read before
    panel = LocalModelsPanel(library, lambda _path: None)
    qtbot.addWidget(panel)

    qtbot.waitUntil(lambda: len(table(panel)) == 7, timeout=5_000)
    library.close()


def test_refresh_shows_a_model_copied_in_by_hand(folder, make_panel, qtbot):
    panel, _ = make_panel(folder)
    write(folder / "mine" / "copied-Q5_K_M.gguf", 10)

    qtbot.mouseClick(panel.refresh_button, Qt.MouseButton.LeftButton)

    qtbot.waitUntil(lambda: any(row[0] == "copied" for row in table(panel)), timeout=5_000)


# -- the bundled model and models opened from elsewhere ----------------------------------------

@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A model file opened from a folder that is not the models folder."""
    return write(tmp_path / "downloads" / "mine-Q5_K_M.gguf", 5000)


@pytest.fixture
def bundled(tmp_path) -> Path:
    return write(tmp_path / "site-packages" / "SmolLM2-135M-Instruct.Q4_1.gguf", 6000)


@pytest.fixture
def opened(tmp_path) -> OpenedModels:
    return OpenedModels(tmp_path / "config" / OPENED_FILE)


def entry_at(library: LocalModels, path: Path):
    return next((e for e in library.listing.entries if e.path == path), None)


def test_a_model_opened_from_elsewhere_is_remembered_across_a_restart_and_offered(
        folder, elsewhere, opened, make_library, run_async):
    clock = Clock()
    library = make_library(folder, clock=clock, opened=opened)

    run_async(library.record_use(str(elsewhere)))
    library.close()
    again = make_library(folder, opened=OpenedModels(opened.file))

    entry = entry_at(again, elsewhere)
    assert (entry.kind, entry.name, entry.quantization, entry.last_used) == (
        OUTSIDE, "mine", "Q5_K_M", clock.now)
    assert again.recent(1) == [elsewhere]
    assert not (folder / LAST_USED_FILE).exists()  # the models folder is not written


def test_the_bundled_model_is_listed_but_never_offered_twice_nor_deleted(
        folder, bundled, opened, make_library, run_async):
    statuses = []
    library = make_library(folder, bundled=lambda: bundled, opened=opened)
    library.attach(Recorder(statuses))
    run_async(library.record_use(None))  # the bundled model loaded

    entry = entry_at(library, bundled)
    assert entry.kind == BUNDLED and entry.last_used is not None
    assert bundled not in library.recent()  # the picker offers it as the bundled one
    assert run_async(library.delete(entry)) == 0
    assert bundled.exists() and statuses[-1][1] and "not in the models folder" in statuses[-1][0]


def test_a_model_opened_from_elsewhere_is_never_deleted_only_forgotten(
        folder, elsewhere, opened, make_library, run_async):
    statuses = []
    library = make_library(folder, opened=opened)
    library.attach(Recorder(statuses))
    run_async(library.record_use(str(elsewhere)))
    entry = entry_at(library, elsewhere)

    assert run_async(library.delete(entry)) == 0
    assert elsewhere.exists()
    run_async(library.forget(entry))

    assert entry_at(library, elsewhere) is None and elsewhere not in library.recent()
    assert elsewhere.exists()
    assert statuses[-1] == (f"Forgot mine; the file stays where it is ({elsewhere}).", False)
    assert OpenedModels(opened.file).read() == {}


def test_a_remembered_model_whose_file_is_gone_is_not_listed(folder, elsewhere, opened,
                                                             make_library, run_async):
    library = make_library(folder, opened=opened)
    run_async(library.record_use(str(elsewhere)))
    elsewhere.unlink()

    run_async(library.refresh())

    assert entry_at(library, elsewhere) is None


def test_only_the_most_recently_loaded_models_are_remembered(opened, tmp_path):
    for n in range(MAX_REMEMBERED + 5):
        opened.note(tmp_path / f"model-{n}.gguf", 1000.0 + n)

    remembered = opened.read()
    assert len(remembered) == MAX_REMEMBERED
    assert tmp_path / "model-0.gguf" not in remembered
    assert tmp_path / f"model-{MAX_REMEMBERED + 4}.gguf" in remembered


def test_the_panel_offers_forget_for_a_model_opened_from_elsewhere_and_no_delete_for_the_bundled(
        folder, elsewhere, bundled, opened, make_panel, run_async, qtbot):
    panel, _ = make_panel(folder, bundled=lambda: bundled, opened=opened)
    run_async(panel.library.record_use(str(elsewhere)))
    names = [row[0] for row in table(panel)]
    assert "mine (opened from a file)" in names and "SmolLM2-135M-Instruct (bundled)" in names

    panel.select(bundled)
    assert panel.load_button.isEnabled() and not panel.delete_button.isEnabled()
    assert panel.confirm_delete() is None
    panel.select(elsewhere)
    assert panel.forget_button.isVisible() and not panel.delete_button.isVisible()
    qtbot.mouseClick(panel.forget_button, Qt.MouseButton.LeftButton)

    qtbot.waitUntil(lambda: "mine (opened from a file)" not in [r[0] for r in table(panel)],
                    timeout=5_000)
    assert elsewhere.exists()
    assert panel.where.text().startswith(f"Models folder: {folder} · 3 models")
