"""`python -m pagoda.engine pull REPO [FILE]`: fetch a model file, or a safetensors model folder, from
the Hugging Face Hub."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from pagoda.engine.errors import HubNotFoundError
from pagoda.engine.folders import MODELS_DIR_ENV_VAR
from pagoda.engine.hub.download import DownloadProgress, download_model_file, download_model_folder
from pagoda.engine.hub.search import HubFile, HubRepo, recommended_file, repo_info


def add_pull_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo", metavar="REPO",
                        help="a model repository, e.g. Qwen/Qwen2.5-1.5B-Instruct-GGUF")
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="the file to fetch (default: the repository's Q4_K_M GGUF file, "
                             "else its smallest 4-bit one, else its only GGUF file; in a "
                             "repository with no GGUF files, its safetensors model folder)")
    parser.add_argument("--dest", type=Path, metavar="DIR",
                        help="the models folder; files go to DIR/OWNER/REPO/ (default: "
                             f"${MODELS_DIR_ENV_VAR}, else 'models' in Pagoda's data folder)")
    parser.add_argument("--token", help="a Hugging Face token for gated or private "
                                        "repositories (default: $HF_TOKEN or a saved login)")
    parser.add_argument("--revision", help="a branch, tag or commit (default: main)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is fetched")


def run_pull(args: argparse.Namespace) -> int:
    filename = args.file
    if filename is None:
        repo = repo_info(args.repo, args.revision, args.token)
        filename = None if _fetches_folder(repo) else _choose_file(repo)
    bar = _ProgressBar(filename or args.repo)
    try:
        if filename is None:
            path = download_model_folder(args.repo, args.dest, on_progress=bar.update,
                                         token=args.token, revision=args.revision)
        else:
            path = download_model_file(args.repo, filename, args.dest, on_progress=bar.update,
                                       token=args.token, revision=args.revision)
    except KeyboardInterrupt:
        bar.close()
        print("interrupted: the partial download is kept; run the same command again to "
              "resume it", file=sys.stderr)
        return 130
    bar.close()
    print(path)
    return 0


def _fetches_folder(repo: HubRepo) -> bool:
    """A repository with no GGUF files is fetched as its model folder, when it is one."""
    return not any(f.is_gguf for f in repo.files) and bool(repo.folder_files)


def _choose_file(repo: HubRepo) -> str:
    files = [f for f in repo.files if f.is_gguf]
    if not files:
        raise HubNotFoundError(
            f"{repo.repo_id} has no GGUF files, and is not a model folder Pagoda loads "
            "(config.json, *.safetensors and tokenizer files at its top level): name the file "
            "to fetch after the repository, or choose another repository.")
    choice = recommended_file(files)
    for file in files:
        mark = "*" if file is choice else " "
        print(f"{mark} {file.filename}  {_size(file)}", file=sys.stderr)
    if choice is None:
        raise ValueError(f"{repo.repo_id} has several GGUF files and none is 4-bit: name the one "
                         "to fetch after the repository.")
    return choice.filename


def _size(file: HubFile) -> str:
    return f"{file.size / 1e9:.2f} GB" if file.size >= 1e8 else f"{file.size / 1e6:.1f} MB"


class _ProgressBar:
    """Bytes, speed and time left on one line (tqdm), from a download's callbacks."""

    def __init__(self, filename: str) -> None:
        self._filename = filename
        self._bar: tqdm | None = None

    def update(self, progress: DownloadProgress) -> None:
        if self._bar is None:
            # A resumed download starts at the bytes already on disk.
            self._bar = tqdm(total=progress.total, initial=progress.done, unit="B",
                             unit_scale=True, unit_divisor=1024, desc=self._filename,
                             file=sys.stderr)
        else:
            self._bar.update(progress.done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
