"""Finding and fetching models from the Hugging Face Hub, without a window: a search, the files
of the chosen repository, and a queue of downloads fetched one at a time. It tells a
`LibraryView` what changed; the "Get models" dialog is one such view, the tests another.

The Hub is asked through pagoda.app.backends.services.hub, on this library's own worker threads: the engine's Hub
client imports huggingface_hub, which is not light, there the first time it is asked anything.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pagoda.app.backends.services import hub
from pagoda.app.backends.services.model_files import default_models_dir
from pagoda.app.components.shared.connections import ConnectionKeys
from pagoda.app.components.shared.tasks import TaskSet

if TYPE_CHECKING:
    from pagoda.app.backends.services.hub import DownloadProgress, HubModel, HubRepo, MemoryFit

logger = logging.getLogger(__name__)

QUEUED, DOWNLOADING, DONE, FAILED, CANCELLED = (
    "queued", "downloading", "done", "failed", "cancelled")
# The Hugging Face token's entry in ConnectionKeys (the system keyring, service "Pagoda").
HUB_TOKEN_ID = "huggingface-hub-token"
# A FileChoice's and a Download's filename for a safetensors repository's whole model folder.
MODEL_FOLDER = ""


@dataclass(slots=True, frozen=True)
class Recommendation:
    """A chat model to start from, before any search: one per size."""

    size: str
    name: str
    repo_id: str
    note: str


# Instruction-tuned Llama-family and Qwen models whose GGUF repositories hold single files
# (one part of a split file does not load), the Q4_K_M of each about 1, 2 and 4.7 GB.
RECOMMENDED_MODELS = (
    Recommendation("Small", "Qwen2.5 1.5B Instruct", "bartowski/Qwen2.5-1.5B-Instruct-GGUF",
                   "quick on any machine; about 1 GB"),
    Recommendation("Medium", "Llama 3.2 3B Instruct", "bartowski/Llama-3.2-3B-Instruct-GGUF",
                   "better answers, still quick on a laptop; about 2 GB"),
    Recommendation("Large", "Qwen2.5 7B Instruct", "bartowski/Qwen2.5-7B-Instruct-GGUF",
                   "the best of the three; needs 8 GB of free memory; about 4.7 GB"),
)


@dataclass(slots=True, frozen=True)
class FileChoice:
    """One file of a repository as the library offers it, or (filename MODEL_FOLDER) its whole
    safetensors model folder. fit: whether it fits this machine's memory, in a few words
    ("fits", "tight", "too big"); fit_detail: the figures behind it. unsupported: why the
    engine does not run it ("mixture-of-experts: not yet"), shown and never downloaded; empty
    when it runs. parameters: the model's parameter count ("7.6B"; a mixture of experts':
    "30.5B, 3.3B active"), empty when the Hub does not tell it."""

    filename: str
    quantization: str | None
    size: int
    recommended: bool
    fit: str = ""
    fit_detail: str = ""
    fit_verdict: str = "unknown"
    unsupported: str = ""
    parameters: str = ""

    @property
    def label(self) -> str:
        return "Whole model folder (safetensors)" if self.filename == MODEL_FOLDER \
            else self.filename

    @property
    def can_download(self) -> bool:
        return not self.unsupported


@dataclass(slots=True)
class Download:
    """One queued, running or ended download. path is set once it is done; error says, in
    words, why it failed or what a cancel kept."""

    id: int
    repo_id: str
    filename: str
    state: str = QUEUED
    done: int = 0
    total: int = 0
    speed: float = 0.0
    seconds_left: float | None = None
    path: Path | None = None
    error: str = ""
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def label(self) -> str:
        return "model folder" if self.filename == MODEL_FOLDER else self.filename

    @property
    def is_active(self) -> bool:
        return self.state in (QUEUED, DOWNLOADING)

    @property
    def progress_text(self) -> str:
        if self.state == QUEUED:
            return "Waiting for the download before it"
        if self.state == DONE:
            return f"Downloaded: {self.path}"
        if self.state in (FAILED, CANCELLED):
            return self.error
        text = f"{format_size(self.done)} of {format_size(self.total)}"
        if self.speed > 0:
            text += f" · {format_size(int(self.speed))}/s"
        if self.seconds_left is not None:
            text += f" · {format_duration(self.seconds_left)} left"
        return text


class LibraryView(Protocol):
    """What the library tells whoever shows it. Every method is called on the event loop."""

    def show_busy(self, text: str) -> None: ...
    def show_results(self, models: list[HubModel]) -> None: ...
    def show_files(self, repo_id: str, files: list[FileChoice]) -> None: ...
    def show_download(self, download: Download) -> None: ...
    def show_status(self, text: str, error: bool = False) -> None: ...


class NullLibraryView:
    """Shows nothing; a view that cares about only some news subclasses it."""

    def show_busy(self, text: str) -> None: ...
    def show_results(self, models: list[HubModel]) -> None: ...
    def show_files(self, repo_id: str, files: list[FileChoice]) -> None: ...
    def show_download(self, download: Download) -> None: ...
    def show_status(self, text: str, error: bool = False) -> None: ...


class ModelLibrary:
    """Search and file listings run on one worker thread, downloads on another, so a slow
    search (about 20 s to fail offline) never holds up a download, nor the event loop. A newer
    search or repository choice makes the answer to an older one be dropped."""

    def __init__(self, dest_dir: Path | None = None, keys: ConnectionKeys | None = None,
                 quantization: Callable[[], str] = lambda: "auto") -> None:
        """quantization: the engine's setting now, which the memory a file takes depends on."""
        self.dest_dir = dest_dir
        self.keys = keys or ConnectionKeys.in_memory()
        self._quantization = quantization
        self.downloads: list[Download] = []
        self._views: list[LibraryView] = []
        self._lookups = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-hub")
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-download")
        self._tasks = TaskSet(self._failed)
        self._asked = 0  # the latest search or file listing; older answers are dropped
        self.busy: str | None = None  # what the latest of them is doing, until it answers
        self._running: Download | None = None
        self._next_id = 1
        self._closed = False
        # Why each listed file the engine does not run is not downloaded, by (repo, filename).
        self._unsupported: dict[tuple[str, str], str] = {}

    def attach(self, view: LibraryView) -> None:
        """`view` is told the downloads, and the search still running (a dialog closed and
        opened again during one)."""
        self._views.append(view)
        if self.busy is not None:
            view.show_busy(self.busy)
        for download in self.downloads:
            view.show_download(download)

    def detach(self, view: LibraryView) -> None:
        if view in self._views:
            self._views.remove(view)

    # -- the token for gated repositories -------------------------------------------------------

    @property
    def has_token(self) -> bool:
        return self.keys.get(HUB_TOKEN_ID) is not None

    def save_token(self, token: str) -> str:
        """Keep a Hugging Face token in the system keyring (never in the chats database) for
        the next searches and downloads; returns what to tell the user. Raises ValueError for
        text that cannot be a token."""
        token = token.strip()
        if not token or any(c.isspace() for c in token):
            raise ValueError("A Hugging Face token is one word, like hf_AbCd…: copy it again "
                             "from your account's Access Tokens page.")
        self.keys.set(HUB_TOKEN_ID, token)
        return self.keys.notice or "The token is saved in the system keyring."

    def forget_token(self) -> None:
        self.keys.delete(HUB_TOKEN_ID)

    def _token(self) -> str | None:
        """The saved token, else None: huggingface_hub's own (HF_TOKEN, a saved login)."""
        return self.keys.get(HUB_TOKEN_ID)

    # -- finding -------------------------------------------------------------------------------

    def search(self, query: str) -> asyncio.Task:
        query = query.strip()
        return self._tasks.spawn(self._ask(f"Searching the Hugging Face Hub for {query!r}…",
                                           _search, query, self._show_results))

    def recommended(self) -> tuple[Recommendation, ...]:
        return RECOMMENDED_MODELS

    def choose_repo(self, repo_id: str) -> asyncio.Task:
        list_files = functools.partial(_list_files, quantization=self._quantization())
        return self._tasks.spawn(self._ask(f"Listing the files of {repo_id}…", list_files,
                                           repo_id, lambda files: self._show_files(repo_id,
                                                                                   files)))

    async def _ask(self, busy: str, work, argument: str, show) -> None:
        self._asked += 1
        asked = self._asked
        self.busy = busy
        self._tell("show_busy", busy)
        loop = asyncio.get_running_loop()
        try:
            answer = await loop.run_in_executor(self._lookups, work, argument, self._token())
        finally:
            if asked == self._asked:
                self.busy = None
        if asked != self._asked:
            return
        if isinstance(answer, str):
            self._tell("show_status", answer, True)
        else:
            self._tell("show_status", "")
            show(answer)

    def _show_results(self, models: list[HubModel]) -> None:
        self._tell("show_results", models)
        if not models:
            self._tell("show_status", "No model matches that search.")
        elif all(m.unsupported for m in models):
            self._tell("show_status", "None of these runs in Pagoda yet: each says why.")

    def _show_files(self, repo_id: str, files: list[FileChoice]) -> None:
        self._unsupported.update({(repo_id, f.filename): f.unsupported for f in files
                                  if f.unsupported})
        self._tell("show_files", repo_id, files)

    # -- fetching ------------------------------------------------------------------------------

    def download(self, repo_id: str, filename: str) -> Download:
        """Queue a file (MODEL_FOLDER: the repository's model folder); it starts once the
        downloads before it have ended. A file already queued or downloading is not queued
        twice. A file listed as one the engine does not run fails at once, saying why."""
        for download in self.downloads:
            if download.is_active and (download.repo_id, download.filename) == (repo_id,
                                                                                 filename):
                return download
        download = Download(self._next_id, repo_id, filename)
        self._next_id += 1
        self.downloads.append(download)
        reason = self._unsupported.get((repo_id, filename))
        if reason:
            download.state = FAILED
            download.error = f"Not downloaded: Pagoda does not run it ({reason})."
        self._tell("show_download", download)
        self._start_next()
        return download

    def cancel(self, download: Download) -> None:
        """A queued download leaves the queue; a running one stops and keeps its partial file,
        so downloading it again resumes."""
        if download.state == QUEUED:
            download.state, download.error = CANCELLED, "Cancelled before it started."
            self._tell("show_download", download)
        elif download.state == DOWNLOADING:
            download.cancel.set()

    async def wait_idle(self) -> None:
        await self._tasks.wait_idle()

    def active_folders(self) -> list[Path]:
        """The repository folders that queued and running downloads write into."""
        dest = self.dest_dir or default_models_dir()
        return [dest / d.repo_id for d in self.downloads if d.is_active]

    def finished_paths(self) -> list[Path]:
        return [d.path for d in self.downloads if d.state == DONE and d.path is not None]

    def _start_next(self) -> None:
        if self._running is not None or self._closed:
            return
        download = next((d for d in self.downloads if d.state == QUEUED), None)
        if download is None:
            return
        self._running = download
        download.state = DOWNLOADING
        self._tell("show_download", download)
        loop = asyncio.get_running_loop()

        def on_progress(progress: DownloadProgress) -> None:  # on the download thread
            loop.call_soon_threadsafe(self._progressed, download, progress)

        # Submitted now, so that close() cancels it whether or not it has started.
        fetched = loop.run_in_executor(self._fetcher, _download, download, self.dest_dir,
                                       on_progress, self._token())
        self._tasks.spawn(self._fetched(download, fetched))

    async def _fetched(self, download: Download, fetched: asyncio.Future) -> None:
        try:
            outcome = await fetched
        except asyncio.CancelledError:  # close() shut the thread down before it began
            outcome = (True, "Stopped when Pagoda closed: download it again to resume.")
        finally:
            self._running = None
        if isinstance(outcome, Path):
            download.state, download.path = DONE, outcome
            download.done = download.total = outcome.stat().st_size
            download.seconds_left = None
        else:
            cancelled, download.error = outcome
            download.state = CANCELLED if cancelled else FAILED
        self._tell("show_download", download)
        self._start_next()

    def _progressed(self, download: Download, progress: DownloadProgress) -> None:
        if download.state != DOWNLOADING:
            return
        download.done, download.total = progress.done, progress.total
        download.speed, download.seconds_left = progress.speed, progress.seconds_left
        self._tell("show_download", download)

    # -- plumbing ------------------------------------------------------------------------------

    def _tell(self, method: str, *args) -> None:
        for view in list(self._views):
            getattr(view, method)(*args)

    def _failed(self, error: BaseException) -> None:
        logger.error("the model library failed", exc_info=error)
        self._tell("show_status", f"Something went wrong: {error}", True)

    def close(self) -> None:
        """Stops a running download (its partial file is kept) and drops the queue."""
        self._closed = True
        for download in self.downloads:
            download.cancel.set()
        self._views.clear()
        self._lookups.shutdown(wait=False, cancel_futures=True)
        self._fetcher.shutdown(wait=False, cancel_futures=True)


def format_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def format_parameters(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def parameter_counts(total: int | None, active: int | None) -> str:
    """A model's parameters: "7.6B"; a mixture of experts', whose tokens each read fewer,
    "30.5B, 3.3B active"; empty when the count is not known."""
    if total is None:
        return ""
    if active is None or active >= total:
        return format_parameters(total)
    return f"{format_parameters(total)}, {format_parameters(active)} active"


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    if seconds >= 60:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds} s"


# -- on the worker threads: the Hub through pagoda.app.backends.services.hub ------------------------------------

def _search(query: str, token: str | None) -> list[HubModel] | str:
    return hub.search(query, token)


def _list_files(repo_id: str, token: str | None, quantization: str) -> list[FileChoice] | str:
    repo = hub.repository(repo_id, token)
    return repo if isinstance(repo, str) else file_choices(repo, quantization, token)


def file_choices(repo: HubRepo, quantization: str = "auto",
                 token: str | None = None) -> list[FileChoice]:
    """The GGUF files of a repository, the recommended first, then its safetensors model folder
    when it has one (one file of a folder alone loads nothing), each with whether it fits this
    machine's memory under the engine's quantization setting, or why the engine does not run
    it: the repository's family, a file's tensor type. Parts of a split GGUF file are left out:
    the engine does not load them."""
    fits = hub.file_fits(repo, quantization, token)
    family = repo.unsupported or ""
    choices = [_choice(f.filename, f.quantization, f.size,
                       f is fits.recommended and not family, fit, family or f.unreadable or "")
               for f, fit in fits.files]
    size = sum(f.size for f in fits.folder_files)
    if fits.folder is not None:
        choices.append(_choice(MODEL_FOLDER, repo.weights_dtype, size,
                               not any(c.can_download for c in choices), fits.folder))
    elif family and fits.folder_files:
        choices.append(FileChoice(MODEL_FOLDER, repo.weights_dtype, size, False,
                                  unsupported=family))
    return choices


def _choice(filename: str, quantization: str | None, size: int, recommended: bool,
            fit: MemoryFit, unsupported: str = "") -> FileChoice:
    return FileChoice(filename, quantization, size, recommended, *fit_words(fit), fit.verdict,
                      unsupported, parameter_counts(fit.num_parameters, fit.num_active_parameters))


def fit_words(fit: MemoryFit) -> tuple[str, str]:
    """Whether it fits, in a few words, and the figures behind it."""
    needed = format_size(fit.needed_bytes)
    if fit.mapped_bytes:
        needed += f" ({format_size(fit.mapped_bytes)} of it experts read from the file as needed)"
    free = "" if fit.available_bytes is None else format_size(fit.available_bytes)
    if fit.verdict == "fits":
        return "fits", f"Needs about {needed} of memory; {free} is free now."
    if fit.verdict == "tight":
        return "tight", (f"Needs about {needed} of memory but only {free} is free now: close "
                         "other programs first.")
    if fit.verdict == "too_big":
        return "too big", (f"Needs about {needed} of memory; this machine has "
                           f"{format_size(fit.total_bytes or 0)} in all.")
    return "", f"Needs about {needed} of memory."


def _download(download: Download, dest_dir: Path | None, on_progress,
              token: str | None) -> Path | tuple[bool, str]:
    filename = None if download.filename == MODEL_FOLDER else download.filename
    return hub.download(download.repo_id, filename, dest_dir, on_progress, token,
                        download.cancel)
