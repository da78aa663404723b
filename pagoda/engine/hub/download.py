"""Downloading a model file, or a safetensors model folder, from the Hugging Face Hub: disk
space checked first, progress reported, resumable, and each file checked against the Hub's
SHA-256 before it takes its final name.

huggingface_hub's hf_hub_download resumes only within one call (a partial file is deleted when
it fails), so the bytes go through its http_get into a partial file of ours that outlives a
cancel, a crash or a lost connection: the next call asks the Hub for the rest (a Range request).
The partial's name carries the checksum it must end with, so a file changed on the Hub since
is started afresh rather than completed with another version's bytes.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from huggingface_hub import hf_hub_url
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers
from tqdm import tqdm

from pagoda.engine.errors import (
    ChecksumMismatchError,
    DownloadCancelledError,
    HubNotFoundError,
    HubUnreachableError,
    NotEnoughDiskError,
    OversizedDownloadError,
    PagodaError,
)
from pagoda.engine.folders import default_models_dir
from pagoda.engine.hub.search import (
    ENGINE_MODEL_TYPES,
    HubFile,
    HubRepo,
    hub_endpoint,
    hub_errors,
    repo_info,
)

logger = logging.getLogger(__name__)

_REPORT_INTERVAL_S = 0.1
_HASH_CHUNK = 1 << 20


@dataclass(slots=True)
class DownloadProgress:
    """done counts the bytes on disk, resumed ones included; speed is over this call's bytes."""

    done: int
    total: int
    speed: float
    seconds_left: float | None


ProgressCallback = Callable[[DownloadProgress], None]


def download_model_file(repo_id: str, filename: str, dest_dir: str | Path | None = None,
                        on_progress: ProgressCallback | None = None, token: str | None = None,
                        cancel: threading.Event | None = None,
                        revision: str | None = None) -> Path:
    """Fetch filename of repo_id into dest_dir/<owner>/<repo>/ (default: default_models_dir())
    and return its path. A file already there complete is returned as it is. Setting cancel
    stops the download with DownloadCancelledError and keeps the partial file for the next call."""
    repo = repo_info(repo_id, revision, token)
    remote = _find(repo.files, repo_id, filename)
    dest = Path(dest_dir or default_models_dir())
    return _download(repo, [remote], dest, remote.filename, on_progress, token, cancel)[0]


def download_model_folder(repo_id: str, dest_dir: str | Path | None = None,
                          on_progress: ProgressCallback | None = None, token: str | None = None,
                          revision: str | None = None,
                          cancel: threading.Event | None = None) -> Path:
    """Fetch the model folder of a safetensors repository (config.json, the weights, the
    tokenizer: pagoda.engine.hub.search.folder_files) into dest_dir/<owner>/<repo>/ and return the folder.
    Each file is fetched as download_model_file fetches one; progress counts the whole folder.
    config.json is written last, so the folder is not a model until everything else is there;
    cancel or a lost connection keeps the partial files, and the next call resumes."""
    repo = repo_info(repo_id, revision, token)
    remotes = repo.folder_files
    if not remotes:
        raise HubNotFoundError(_not_a_folder_message(repo))
    dest = Path(dest_dir or default_models_dir())
    *rest, config = [model_file_path(dest, repo_id, f.filename) for f in remotes]
    if not all(_is_complete(path, f) for path, f in zip(rest, remotes[:-1], strict=True)):
        config.unlink(missing_ok=True)  # an update in progress is not a model either
    return _download(repo, remotes, dest, repo_id, on_progress, token, cancel)[-1].parent


def _not_a_folder_message(repo: HubRepo) -> str:
    if repo.model_type not in ENGINE_MODEL_TYPES | {None}:
        return (f"{repo.repo_id} holds a {repo.model_type} model, which Pagoda does not run "
                f"(it runs {', '.join(sorted(ENGINE_MODEL_TYPES))}): choose another repository.")
    return (f"{repo.repo_id} is not a model folder Pagoda loads: that needs config.json, "
            "safetensors weights and a tokenizer (tokenizer.json or tokenizer.model) at its top "
            "level. Choose a GGUF file or another repository.")


def _download(repo: HubRepo, remotes: list[HubFile], dest: Path, what: str,
              on_progress: ProgressCallback | None, token: str | None,
              cancel: threading.Event | None) -> list[Path]:
    """Fetch remotes in order (the ones not already complete), after one disk-space check for
    all they still need; what names them in that check's error."""
    targets = [model_file_path(dest, repo.repo_id, f.filename) for f in remotes]
    pending = [_prepare(f, path) for f, path in zip(remotes, targets, strict=True)
               if not _is_complete(path, f)]
    if not pending:
        return targets
    check_disk_space(targets[0].parent, sum(p.remote.size - p.have for p in pending), what)
    on_disk = sum(f.size for f in remotes) - sum(p.remote.size - p.have for p in pending)
    progress = _Progress(sum(f.size for f in remotes), on_disk, on_progress, cancel)
    for p in pending:
        _fetch(repo.repo_id, repo.commit, p.remote, p.partial, p.have, progress, token)
        _verify(p.partial, p.remote, repo.repo_id)
        p.partial.replace(p.target)
        logger.info("downloaded %s from %s to %s", p.remote.filename, repo.repo_id, p.target)
    return targets


def _is_complete(target: Path, remote: HubFile) -> bool:
    return target.is_file() and target.stat().st_size == remote.size


@dataclass(slots=True)
class _Pending:
    """A file still to fetch; have: the bytes its partial file holds already."""

    remote: HubFile
    target: Path
    partial: Path
    have: int


def _prepare(remote: HubFile, target: Path) -> _Pending:
    """Make the file's folder and drop the partials of other versions of it."""
    partial = partial_path(target, remote)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_other_partials(target, partial)
    return _Pending(remote, target, partial, _usable_partial_size(partial, remote.size))


def model_file_path(dest_dir: str | Path, repo_id: str, filename: str) -> Path:
    parts = [*repo_id.split("/"), *PurePosixPath(filename).parts]
    if any(part in ("", ".", "..") or part.startswith("/") for part in parts):
        raise ValueError(f"{repo_id}/{filename} is not a path inside the models folder")
    return Path(dest_dir, *parts)


def partial_path(target: Path, remote: HubFile) -> Path:
    checksum = remote.sha256 or remote.blob_id or "unchecked"
    return target.with_name(f"{target.name}.{checksum[:12]}.incomplete")


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def check_disk_space(folder: Path, needed: int, filename: str) -> None:
    free = free_bytes(folder)
    if free < needed:
        raise NotEnoughDiskError(
            f"{filename} needs {_gb(needed)} ({needed:,} bytes) in {folder}, but only "
            f"{_gb(free)} ({free:,} bytes) are free: free some space or choose another folder.")


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB"


def _find(files: list[HubFile], repo_id: str, filename: str) -> HubFile:
    for file in files:
        if file.filename == filename:
            return file
    ggufs = ", ".join(f.filename for f in files if f.is_gguf) or "none"
    raise HubNotFoundError(f"there is no file {filename} in {repo_id} (its GGUF files: {ggufs}).")


def _remove_other_partials(target: Path, partial: Path) -> None:
    """Partial files of versions the Hub no longer serves under this name."""
    for other in target.parent.glob(f"{glob.escape(target.name)}.*.incomplete"):
        if other != partial:
            other.unlink()


def _usable_partial_size(partial: Path, size: int) -> int:
    if not partial.is_file():
        return 0
    have = partial.stat().st_size
    if have > size:  # not a prefix of this file: start again
        partial.unlink()
        return 0
    return have


def _fetch(repo_id: str, commit: str, remote: HubFile, partial: Path, have: int,
           progress: _Progress, token: str | None) -> None:
    if have:
        logger.info("resuming %s at byte %d of %d", remote.filename, have, remote.size)
    url = hf_hub_url(repo_id, remote.filename, revision=commit, endpoint=hub_endpoint())
    progress.start_file(have)
    try:
        with hub_errors(repo_id, remote.filename, token), partial.open("ab") as file:
            writer = _ProgressFile(file, progress, remote.size)
            progress.report(have, force=True)  # where it starts: 0, or what is on disk
            progress.check_cancel()
            http_get(url, writer, resume_size=have, headers=build_hf_headers(token=token),
                     expected_size=remote.size, displayed_filename=remote.filename,
                     tqdm_class=_NoBar)
            progress.report(file.tell(), force=True)
    except HubUnreachableError as exc:
        raise HubUnreachableError(f"{exc} The {partial.stat().st_size:,} bytes of "
                                  f"{remote.filename} fetched so far are kept: the next "
                                  "download resumes from there.") from exc
    except PagodaError:
        raise
    except _TooLong:
        partial.unlink(missing_ok=True)
        raise OversizedDownloadError(
            f"the Hub sent more bytes than the file's size: {remote.filename} from {repo_id} is "
            f"{remote.size:,} bytes, and more kept coming. Nothing was kept; download it again "
            "later, or choose another file.") from None
    except _Cancelled:
        raise DownloadCancelledError(
            f"the download of {remote.filename} was cancelled: {partial.stat().st_size:,} of "
            f"{remote.size:,} bytes are kept in {partial}, and the next download resumes "
            "from there.") from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NotEnoughDiskError(f"the disk filled up while downloading {remote.filename} "
                                     f"into {partial.parent}: free some space and download "
                                     "it again to resume.") from exc
        if exc.errno is None:  # http_get's size check: the body ended early
            raise HubUnreachableError(f"the Hub stopped sending {remote.filename} before its "
                                      "end: the next download resumes from there.") from exc
        raise


def _verify(partial: Path, remote: HubFile, repo_id: str) -> None:
    if remote.sha256:
        kind, expected, actual = "SHA-256", remote.sha256, _sha256(partial)
    elif remote.blob_id:
        kind, expected, actual = "git blob id", remote.blob_id, _git_blob_id(partial)
    else:
        logger.warning("the Hub published no checksum for %s in %s", remote.filename, repo_id)
        return
    if actual != expected:
        partial.unlink()
        raise ChecksumMismatchError(
            f"{remote.filename} from {repo_id} arrived damaged: its {kind} is {actual}, the Hub "
            f"published {expected}. The file was deleted; download it again.")


def _sha256(path: Path) -> str:
    return _hash_file(path, hashlib.sha256())


def _git_blob_id(path: Path) -> str:
    return _hash_file(path, hashlib.sha1(f"blob {path.stat().st_size}\0".encode()))


def _hash_file(path: Path, digest) -> str:
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _Cancelled(Exception):
    """Raised from inside http_get's loop; not one of the network errors it retries."""


class _TooLong(Exception):
    """Raised from inside http_get's loop when a chunk would take the file past its size."""


class _NoBar(tqdm):
    """http_get draws a progress bar of its own unless given a class; ours are the callbacks."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, disable=True, **kwargs)


class _Progress:
    """The bytes on disk of everything one call fetches, told to on_progress at most every
    _REPORT_INTERVAL_S (and at each file's start and end); the speed counts this call's bytes."""

    def __init__(self, total: int, on_disk: int, on_progress: ProgressCallback | None,
                 cancel: threading.Event | None) -> None:
        self._total = total
        self._on_disk = on_disk
        self._others = on_disk  # the bytes on disk of the files other than the current one
        self._first = on_disk
        self._on_progress = on_progress
        self._cancel = cancel
        self._started = time.monotonic()
        self._reported = 0.0
        self._reported_done: int | None = None

    def start_file(self, have: int) -> None:
        self._others = self._on_disk - have

    def check_cancel(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise _Cancelled

    def report(self, file_done: int, force: bool = False) -> None:
        done = self._others + file_done
        self._on_disk = done
        now = time.monotonic()
        if self._on_progress is None or done == self._reported_done or (
                not force and now - self._reported < _REPORT_INTERVAL_S and done < self._total):
            return
        self._reported, self._reported_done = now, done
        speed = max(done - self._first, 0) / max(now - self._started, 1e-6)
        left = (self._total - done) / speed if speed > 0 else None
        self._on_progress(DownloadProgress(done, self._total, speed, left))


class _ProgressFile:
    """The partial file as http_get writes to it: reports progress, stops on cancel, and never
    grows past size (http_get itself compares sizes only once the body has ended)."""

    def __init__(self, file: BinaryIO, progress: _Progress, size: int) -> None:
        self._file = file
        self._progress = progress
        self._size = size

    def write(self, chunk: bytes) -> int:
        if self._file.tell() + len(chunk) > self._size:
            raise _TooLong
        written = self._file.write(chunk)
        self._progress.report(self._file.tell())
        self._progress.check_cancel()
        return written

    # http_get rewinds when a server ignores the Range header and sends the whole file.
    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        return self._file.truncate(size)
