"""The model library without a window, against a fake Hub on 127.0.0.1: what a user searching,
choosing a file, and downloading it sees."""

from __future__ import annotations

import time

import pytest

from pagoda.app.components.models.model_library import (
    CANCELLED,
    DONE,
    DOWNLOADING,
    FAILED,
    MODEL_FOLDER,
    QUEUED,
    Download,
    FileChoice,
    ModelLibrary,
    NullLibraryView,
)
from pagoda.app.components.shared.connections import ConnectionKeys
from tests.app.qt.fake_keyring import FakeKeyring
from tests.conftest import (
    LIBRARY_FILES,
    LIBRARY_FOLDER_REPO,
    LIBRARY_GATED_REPO,
    LIBRARY_MOE_FOLDER_REPO,
    LIBRARY_MOE_REPO,
    LIBRARY_REPO,
    LIBRARY_TERNARY_REPO,
)
from tests.engine.fake_hub import TOKEN

Q4, Q8 = "tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"


class RecordingView(NullLibraryView):
    def __init__(self) -> None:
        self.results: list = []
        self.files: dict[str, list[FileChoice]] = {}
        self.updates: list[tuple[int, str, int]] = []
        self.statuses: list[tuple[str, bool]] = []
        self.busy: list[str] = []

    def show_busy(self, text: str) -> None:
        self.busy.append(text)

    def show_results(self, models) -> None:
        self.results = models

    def show_files(self, repo_id: str, files: list[FileChoice]) -> None:
        self.files[repo_id] = files

    def show_download(self, download: Download) -> None:
        self.updates.append((download.id, download.state, download.done))

    def show_status(self, text: str, error: bool = False) -> None:
        self.statuses.append((text, error))


@pytest.fixture
def library(library_hub, tmp_path):
    library = ModelLibrary(tmp_path / "models")
    yield library
    library.close()


@pytest.fixture
def view(library) -> RecordingView:
    view = RecordingView()
    library.attach(view)
    return view


@pytest.fixture
def slow_pieces(monkeypatch):
    """Every piece reported, and written slowly enough for a cancel to land mid-file."""
    from pagoda.engine.hub.download import _ProgressFile

    write = _ProgressFile.write
    monkeypatch.setattr("pagoda.engine.hub.download._REPORT_INTERVAL_S", 0.0)
    monkeypatch.setattr(_ProgressFile, "write",
                        lambda self, chunk: (time.sleep(0.02), write(self, chunk))[1])


async def test_a_search_shows_the_repositories_the_engine_runs_most_downloaded_first(library,
                                                                                   view):
    await library.search("tiny")

    assert [m.repo_id for m in view.results] == ["pagoda-test/tiny-llama", LIBRARY_REPO]
    assert view.busy == ["Searching the Hugging Face Hub for 'tiny'…"]
    assert view.statuses[-1] == ("", False)


async def test_a_view_attached_during_a_search_is_told_it_runs_until_it_answers(
        library, view, monkeypatch):
    import asyncio
    import threading

    from pagoda.app.components.models import model_library

    release, search = threading.Event(), model_library._search
    monkeypatch.setattr(model_library, "_search",
                        lambda query, token: (release.wait(10), search(query, token))[1])
    running = library.search("tiny")
    await asyncio.sleep(0.05)
    reopened = RecordingView()
    library.attach(reopened)  # the dialog closed and opened again during the search

    assert library.busy == reopened.busy[0] == "Searching the Hugging Face Hub for 'tiny'…"
    release.set()
    await running
    assert library.busy is None
    assert reopened.statuses[-1] == ("", False) and reopened.results


async def test_a_search_that_finds_nothing_says_so(library, view):
    await library.search("no-such-model")

    assert view.results == []
    assert "No model" in view.statuses[-1][0]


async def test_a_repository_lists_its_model_files_with_size_and_quantization_recommended_first(
        library, view):
    await library.choose_repo(LIBRARY_REPO)

    assert [(f.filename, f.quantization, f.size, f.recommended)
            for f in view.files[LIBRARY_REPO]] == [(Q4, "Q4_K_M", len(LIBRARY_FILES[Q4]), True),
                                                   (Q8, "Q8_0", len(LIBRARY_FILES[Q8]), False)]


@pytest.mark.parametrize(("available", "total", "fit"),
                         [(8 << 30, 16 << 30, "fits"), (1 << 30, 16 << 30, "tight"),
                          (1 << 30, 1 << 30, "too big")])
async def test_each_file_says_whether_it_fits_this_machines_memory(
        library, view, monkeypatch, available, total, fit):
    monkeypatch.setattr("pagoda.engine.hub.fit.available_memory", lambda: available)
    monkeypatch.setattr("pagoda.engine.hub.fit.total_memory", lambda: total)

    await library.choose_repo(LIBRARY_REPO)

    choice = view.files[LIBRARY_REPO][0]
    assert choice.fit == fit and choice.fit_detail.startswith("Needs about 1.")


async def test_a_safetensors_repository_is_offered_and_fetched_as_one_model_folder(
        library, view, tmp_path):
    from pagoda.engine.loading.model_info import describe_model

    await library.choose_repo(LIBRARY_FOLDER_REPO)
    [choice] = view.files[LIBRARY_FOLDER_REPO]
    assert (choice.filename, choice.label) == (MODEL_FOLDER, "Whole model folder (safetensors)")
    assert choice.recommended and choice.quantization == "F32"

    download = library.download(LIBRARY_FOLDER_REPO, MODEL_FOLDER)
    await library.wait_idle()

    assert download.state == DONE and download.label == "model folder"
    assert download.path == tmp_path / "models" / "pagoda-test" / "pocket-llama"
    assert (download.path / "config.json").is_file()
    assert describe_model(download.path).format == "safetensors"


async def test_a_search_lists_models_the_engine_does_not_run_with_the_reason(library, view):
    await library.search("moe")

    assert {m.repo_id: m.unsupported for m in view.results} == {
        LIBRARY_MOE_REPO: "mixture-of-experts: not yet",
        LIBRARY_MOE_FOLDER_REPO: "mixture-of-experts: not yet"}
    assert view.statuses[-1] == ("None of these runs in Pagoda yet: each says why.", False)


@pytest.mark.parametrize(("repo", "filename"), [(LIBRARY_MOE_REPO, "moe-Q4_K_M.gguf"),
                                                (LIBRARY_MOE_FOLDER_REPO, MODEL_FOLDER)])
async def test_the_files_of_a_family_the_engine_does_not_run_are_listed_with_the_reason_and_never_fetched(
        library, view, library_hub, repo, filename):
    await library.choose_repo(repo)
    [choice] = view.files[repo]
    assert (choice.filename, choice.unsupported) == (filename, "mixture-of-experts: not yet")
    assert not choice.can_download and not choice.recommended

    download = library.download(repo, filename)
    await library.wait_idle()

    assert download.state == FAILED
    assert download.error == ("Not downloaded: Pagoda does not run it (mixture-of-experts: not "
                              "yet).")
    assert not any("/resolve/" in r for r in library_hub.requests)


async def test_a_file_of_a_type_the_engine_cannot_read_is_listed_beside_the_ones_it_can(
        library, view):
    await library.choose_repo(LIBRARY_TERNARY_REPO)

    assert [(f.filename, f.recommended, f.unsupported) for f in view.files[LIBRARY_TERNARY_REPO]
            ] == [("ternary-Q4_K_M.gguf", True, ""),
                  ("ternary-TQ2_0.gguf", False, "TQ2_0 tensors: a type Pagoda cannot read yet")]


async def test_an_unknown_repository_is_explained_in_words(library, view):
    await library.choose_repo("pagoda-test/nothing-here")

    text, error = view.statuses[-1]
    assert error and "There is no model repository pagoda-test/nothing-here" in text


async def test_offline_mode_is_said_plainly(library, view, monkeypatch, library_hub):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    await library.search("tiny")

    text, error = view.statuses[-1]
    assert error and text.startswith("Offline mode is on")
    assert library_hub.requests == []


async def test_a_download_reports_progress_and_ends_with_its_path(library, view, slow_pieces,
                                                                  tmp_path):
    download = library.download(LIBRARY_REPO, Q4)
    await library.wait_idle()

    assert download.state == DONE
    assert download.path == tmp_path / "models" / "pagoda-test" / "tiny-GGUF" / Q4
    assert download.path.read_bytes() == LIBRARY_FILES[Q4]
    assert library.finished_paths() == [download.path]
    progress = [done for _id, state, done in view.updates if state == DOWNLOADING]
    assert progress[0] == 0 and len(progress) > 3 and progress == sorted(progress)
    assert view.updates[-1] == (download.id, DONE, len(LIBRARY_FILES[Q4]))
    assert "Downloaded" in download.progress_text


async def test_downloads_run_one_at_a_time_in_the_order_queued(library, view, library_hub):
    first = library.download(LIBRARY_REPO, Q4)
    second = library.download(LIBRARY_REPO, Q8)

    assert (first.state, second.state) == (DOWNLOADING, QUEUED)
    assert library.download(LIBRARY_REPO, Q8) is second  # not queued twice
    await library.wait_idle()

    assert (first.state, second.state) == (DONE, DONE)
    assert [d.filename for d in library_hub.downloads if d.method == "GET"] == [Q4, Q8]


async def test_a_queued_download_cancelled_never_starts(library, view, library_hub):
    library.download(LIBRARY_REPO, Q4)
    second = library.download(LIBRARY_REPO, Q8)

    library.cancel(second)
    await library.wait_idle()

    assert second.state == CANCELLED
    assert library_hub.gets(Q8) == []


async def test_a_cancelled_download_keeps_its_partial_and_the_next_one_resumes(
        library, view, library_hub, slow_pieces):
    class CancelMidFile(RecordingView):
        def show_download(self, download: Download) -> None:
            if download.state == DOWNLOADING and download.done > 0:
                library.cancel(download)

    library.attach(CancelMidFile())
    download = library.download(LIBRARY_REPO, Q8)
    await library.wait_idle()

    assert download.state == CANCELLED
    assert "resumes" in download.error and download.error in download.progress_text
    assert 0 < download.done < len(LIBRARY_FILES[Q8])

    library.detach(library._views[-1])
    again = library.download(LIBRARY_REPO, Q8)
    await library.wait_idle()

    assert again.state == DONE and again.path.read_bytes() == LIBRARY_FILES[Q8]
    assert library_hub.gets(Q8)[-1].range.startswith("bytes=")


async def test_a_damaged_download_fails_and_says_why_in_words(library, view, library_hub):
    library_hub.fault.corrupt = True
    failed = library.download(LIBRARY_REPO, Q4)
    await library.wait_idle()

    assert failed.state == FAILED
    assert "arrived damaged" in failed.error and failed.error[0].isupper()


async def test_closing_stops_the_running_download_and_starts_no_other(library, view,
                                                                       library_hub, slow_pieces):
    first = library.download(LIBRARY_REPO, Q4)
    second = library.download(LIBRARY_REPO, Q8)

    library.close()
    await library.wait_idle()

    assert first.state == CANCELLED and second.state == QUEUED
    assert library_hub.gets(Q8) == []


async def test_a_gated_download_without_a_token_says_where_to_accept_and_what_to_save(
        library, view):
    failed = library.download(LIBRARY_GATED_REPO, "locked-Q4_K_M.gguf")
    await library.wait_idle()

    assert failed.state == FAILED
    assert failed.error.startswith(f"{LIBRARY_GATED_REPO} is gated: accept its terms at http")
    assert "save a Hugging Face token" in failed.error


async def test_a_saved_token_is_kept_in_the_keyring_and_opens_a_gated_repository(
        library_hub, tmp_path):
    keyring = FakeKeyring()
    library = ModelLibrary(tmp_path / "models", ConnectionKeys(keyring))
    try:
        assert library.save_token(f"  {TOKEN}\n") == "The token is saved in the system keyring."
        assert keyring.passwords == {("Pagoda", "huggingface-hub-token"): TOKEN}

        download = library.download(LIBRARY_GATED_REPO, "locked-Q4_K_M.gguf")
        await library.wait_idle()

        assert download.state == DONE
        assert library_hub.gets("locked-Q4_K_M.gguf")[-1].authorization == f"Bearer {TOKEN}"
    finally:
        library.close()
    assert ModelLibrary(keys=ConnectionKeys(keyring)).has_token  # the next run has it


async def test_a_forgotten_token_is_no_longer_sent(library, library_hub):
    library.save_token(TOKEN)
    library.forget_token()

    failed = library.download(LIBRARY_GATED_REPO, "locked-Q4_K_M.gguf")
    await library.wait_idle()

    assert not library.has_token and failed.state == FAILED
    assert library_hub.gets("locked-Q4_K_M.gguf")[-1].authorization is None


def test_text_that_cannot_be_a_token_is_refused(library):
    for text in ["", "   ", "hf_abc def"]:
        with pytest.raises(ValueError, match="one word"):
            library.save_token(text)
    assert not library.has_token


def test_without_a_keyring_the_token_is_kept_for_this_run_and_that_is_said(library):
    said = library.save_token(TOKEN)

    assert library.has_token and "kept in memory until Pagoda closes" in said


def test_a_small_a_medium_and_a_large_model_are_recommended_before_any_search(library):
    sizes = [r.size for r in library.recommended()]

    assert sizes == ["Small", "Medium", "Large"]
    assert all(r.repo_id.endswith("-GGUF") for r in library.recommended())


async def test_the_folders_downloads_write_into_are_known_until_they_end(library, tmp_path):
    library.download(LIBRARY_REPO, Q4)

    assert library.active_folders() == [tmp_path / "models" / "pagoda-test" / "tiny-GGUF"]
    await library.wait_idle()
    assert library.active_folders() == []


def test_the_parts_of_a_split_gguf_file_are_not_offered():
    from pagoda.app.components.models.model_library import file_choices
    from pagoda.engine.hub.search import HubFile, HubRepo
    from pagoda.engine.loading.model_files import quantization_of

    names = ["m-Q4_K_M.gguf", "m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"]
    files = [HubFile(n, 1000, None, None, quantization_of(n)) for n in names]

    assert [c.filename for c in file_choices(HubRepo("o/m", "0" * 40, files))] == [names[0]]
