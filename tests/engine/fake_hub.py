"""A fake Hugging Face Hub: the routes huggingface_hub 2.4.0 calls to search models
(GET /api/models), describe a repository with its files' sizes and LFS checksums, its parameter
count (the Hub's "gguf" and "safetensors" fields) and model type ("config")
(GET /api/models/{repo}[/revision/{rev}]?blobs=True) and download a file
(GET/HEAD /{repo}/resolve/{rev}/{file}, with Range requests and the headers its download code
reads: ETag, X-Repo-Commit, Content-Length, X-Linked-Size, Accept-Ranges). Errors carry the
X-Error-Code header its hf_raise_for_status turns into RepositoryNotFoundError, GatedRepoError
and the rest. A test chooses faults: a connection dropped mid-file, a corrupted body, a body longer than the
file's published size.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

TOKEN = "hf_fake_token"
_PIECE = 16 << 10
_LFS_SUFFIXES = (".gguf", ".safetensors")


@dataclass(slots=True)
class FakeRepo:
    repo_id: str
    tags: list[str]
    files: dict[str, bytes]
    downloads: int = 0
    likes: int = 0
    gated: bool = False
    architecture: str | None = None  # what the Hub reads from a GGUF file's header
    num_parameters: int | None = None  # what the Hub counts in the GGUF or safetensors headers
    safetensors_dtype: str = "F32"
    model_type: str | None = None  # what the Hub reads from config.json
    sha: str = "c0ffee" * 6 + "0000"

    def sibling(self, name: str) -> dict:
        data = self.files[name]
        entry = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if name.endswith(_LFS_SUFFIXES):
            entry["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                            "pointerSize": 134}
        return entry

    def summary(self) -> dict:
        summary = {"id": self.repo_id, "downloads": self.downloads, "likes": self.likes,
                   "gated": "manual" if self.gated else False, "tags": self.tags}
        if self.architecture:
            summary["gguf"] = {"architecture": self.architecture}
            if self.num_parameters:
                summary["gguf"]["total"] = self.num_parameters
        if "safetensors" in self.tags and self.num_parameters:
            summary["safetensors"] = {"parameters": {self.safetensors_dtype: self.num_parameters},
                                      "total": self.num_parameters}
        if self.model_type:
            summary["config"] = {"model_type": self.model_type}
        return summary


@dataclass(slots=True)
class Fault:
    drop_at: int | None = None  # the file's byte at which a download's connection drops
    drops: int = 1  # how many downloads (retries included) drop there
    corrupt: bool = False  # every file served with one byte changed
    extra_bytes: int = 0  # sent after each file's end (in Content-Length too, not in its size)
    only: str | None = None  # the one file the faults apply to; None: every file


@dataclass(slots=True)
class Download:
    method: str
    filename: str
    range: str | None
    authorization: str | None


class _Dropped(Exception):
    """Raised in the body to make uvicorn cut the connection mid-file."""


@dataclass(slots=True)
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    fault: Fault = field(default_factory=Fault)
    requests: list[str] = field(default_factory=list)
    downloads: list[Download] = field(default_factory=list)
    url: str = ""

    def add(self, repo: FakeRepo) -> None:
        self.repos[repo.repo_id] = repo

    def reset(self) -> None:
        self.fault = Fault()
        self.requests.clear()
        self.downloads.clear()

    def gets(self, filename: str) -> list[Download]:
        return [d for d in self.downloads if d.method == "GET" and d.filename == filename]

    def app(self) -> FastAPI:
        app = FastAPI()
        app.middleware("http")(self._record)
        app.get("/api/models")(self._search)
        app.get("/api/models/{owner}/{name}")(self._info)
        app.get("/api/models/{owner}/{name}/revision/{revision}")(self._info)
        app.api_route("/{owner}/{name}/resolve/{revision}/{filename:path}",
                      methods=["GET", "HEAD"])(self._resolve)
        return app

    async def _record(self, request: Request, call_next):
        self.requests.append(f"{request.method} {request.url.path}")
        return await call_next(request)

    def _search(self, request: Request) -> list[dict]:
        query = request.query_params.get("search", "").lower()
        tags = request.query_params.getlist("filter")
        limit = int(request.query_params.get("limit", 1000))
        found = [r for r in self.repos.values()
                 if query in r.repo_id.lower() and all(t in r.tags for t in tags)]
        found.sort(key=lambda r: r.downloads, reverse=True)
        return [r.summary() for r in found[:limit]]

    def _info(self, owner: str, name: str, revision: str = "main") -> Response:
        repo = self.repos.get(f"{owner}/{name}")
        if repo is None:
            return _error(404, "RepoNotFound", "Repository not found")
        if revision not in ("main", repo.sha):
            return _error(404, "RevisionNotFound", "Invalid rev id")
        info = repo.summary() | {"sha": repo.sha,
                                 "siblings": [repo.sibling(n) for n in repo.files]}
        return JSONResponse(info)

    def _resolve(self, request: Request, owner: str, name: str, revision: str,
                 filename: str) -> Response:
        repo = self.repos.get(f"{owner}/{name}")
        authorization = request.headers.get("authorization")
        self.downloads.append(Download(request.method, filename, request.headers.get("range"),
                                       authorization))
        if repo is None:
            return _error(404, "RepoNotFound", "Repository not found")
        if repo.gated and authorization != f"Bearer {TOKEN}":
            return _error(401, "GatedRepo", "Access to this model is restricted.")
        if revision not in ("main", repo.sha):
            return _error(404, "RevisionNotFound", "Invalid rev id")
        if filename not in repo.files:
            return _error(404, "EntryNotFound", f"{filename} does not exist")
        faulty = self.fault.only in (None, filename)
        data = self._served_bytes(repo.files[filename]) if faulty else repo.files[filename]
        size = len(data)
        if faulty:
            data += b"\0" * self.fault.extra_bytes
        start = _range_start(request.headers.get("range"))
        headers = {"ETag": f'"{repo.sibling(filename).get("lfs", {}).get("sha256", "x")}"',
                   "X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes",
                   "X-Linked-Size": str(size), "Content-Length": str(len(data) - start)}
        status = 200
        if start:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)
        drop_at = self._drop_at() if faulty else None
        return StreamingResponse(_pieces(data, start, drop_at), status_code=status,
                                 headers=headers, media_type="application/octet-stream")

    def _drop_at(self) -> int | None:
        if self.fault.drop_at is None or self.fault.drops <= 0:
            return None
        self.fault.drops -= 1
        return self.fault.drop_at

    def _served_bytes(self, data: bytes) -> bytes:
        if not self.fault.corrupt:
            return data
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def _range_start(header: str | None) -> int:
    match = re.fullmatch(r"bytes=(\d+)-", header or "")
    return int(match.group(1)) if match else 0


async def _pieces(data: bytes, start: int, drop_at: int | None):
    for offset in range(start, len(data), _PIECE):
        end = offset + _PIECE if drop_at is None else min(offset + _PIECE, drop_at)
        if end <= offset:
            raise _Dropped
        yield data[offset:end]


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status,
                        headers={"X-Error-Code": code, "X-Error-Message": message})


@contextlib.contextmanager
def served(hub: FakeHub) -> Iterator[FakeHub]:
    """The hub on 127.0.0.1 (its url set) for as long as the block runs: a session or module
    fixture yields from it."""
    from pagoda.engine.server.runner import ServerThread

    server = ServerThread(hub.app()).start()
    hub.url = server.url
    try:
        yield hub
    finally:
        server.stop()


def use_hub(hub: FakeHub, monkeypatch, tmp_path: Path, chunk: int) -> FakeHub:
    """A served hub, its faults and records reset, as huggingface_hub's endpoint for one test
    (point_client_at)."""
    hub.reset()
    point_client_at(hub.url, monkeypatch, tmp_path, chunk)
    return hub


def point_client_at(url: str, monkeypatch, tmp_path: Path, chunk: int) -> None:
    """huggingface_hub's endpoint set to url (the environment and the constants it read at
    import), no token or offline mode from outside, downloads into tmp_path/models, read in
    pieces of chunk bytes so a tiny file shows progress."""
    from huggingface_hub import constants

    for name, value in hub_environment(url, tmp_path).items():
        monkeypatch.setenv(name, value)
    for name in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # hf_hub_url builds from the template, then swaps a prefix equal to ENDPOINT: keep both.
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", chunk)


def hub_environment(url: str, tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": url, "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(tmp_path / "hf-home"),
            "PAGODA_MODELS_DIR": str(tmp_path / "models")}
