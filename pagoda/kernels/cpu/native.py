"""Build our C kernels (pagoda/kernels/cpu/*.c) once per machine and load them with ctypes.

A library is compiled into a folder the caller names (the engine passes its cache folder),
under a key made of the source, the flags and the compiler's version: a changed source or a
new compiler builds a new library, an unchanged one loads in milliseconds. A build writes to a
private name and is renamed into place, so two processes building at once never load half a
file. Where a prebuilt library sits beside the source (a packaged installer puts one there:
its users may have no compiler), it is loaded instead.

Sources are compiled with -fopenmp but linked without libgomp, and torch's own OpenMP runtime
is made global before a library loads, so their parallel regions run on torch's thread team:
a second runtime would bring a second team to fight torch's for the same cores.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import torch

SOURCE_DIR = Path(__file__).parent
COMPILE_FLAGS = ("-O3", "-march=x86-64-v2", "-fopenmp", "-fPIC")
_BUILD_TIMEOUT_S = 300

_loaded: dict[Path, ctypes.CDLL] = {}
_lock = threading.Lock()


class NativeBuildError(RuntimeError):
    """A C kernel could not be compiled or loaded; the caller falls back to torch's kernels."""


def find_compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def source_path(name: str, source_dir: Path | None = None) -> Path:
    return (source_dir or SOURCE_DIR) / f"{name}.c"


def prebuilt_path(name: str) -> Path:
    return SOURCE_DIR / f"lib{name}.so"


def kernel_names() -> list[str]:
    """Our C kernels, by the sources here or, in a packaged installer, the prebuilt libraries."""
    names = {p.stem for p in SOURCE_DIR.glob("*.c")}
    names |= {p.name[len("lib"):-len(".so")] for p in SOURCE_DIR.glob("lib*.so")}
    return sorted(names)


def build_prebuilt(name: str, out_dir: Path, compiler: str | None = None) -> Path:
    """Compile pagoda/kernels/cpu/<name>.c to out_dir/lib<name>.so for an installer to ship beside the
    sources, where `load` will prefer it."""
    built = build(name, out_dir / "keyed", compiler)
    target = out_dir / built.name
    shutil.copyfile(built, target)
    return target


def load(name: str, build_dir: Path | None, compiler: str | None = None) -> ctypes.CDLL:
    """pagoda/kernels/cpu/<name>.c as a loaded library: the prebuilt one if shipped, else built (once)
    under build_dir. Raises NativeBuildError naming what is missing."""
    prebuilt = prebuilt_path(name)
    if prebuilt.exists():
        return _open(prebuilt)
    if build_dir is None:
        raise NativeBuildError(f"pagoda/kernels/cpu/{name}.c has no prebuilt library and no folder "
                               "to build one in")
    return _open(build(name, build_dir, compiler))


def build(name: str, build_dir: Path, compiler: str | None = None,
          source_dir: Path | None = None) -> Path:
    """Compile pagoda/kernels/cpu/<name>.c (or source_dir's, with the headers beside it: another
    revision's, a bench's own) into build_dir/<key>/lib<name>.so unless it is there."""
    compiler = compiler or find_compiler()
    if compiler is None:
        raise NativeBuildError("no C compiler found to build Pagoda's CPU kernels: install gcc "
                               "or set CC (torch's kernels run meanwhile)")
    source = source_path(name, source_dir)
    lib = build_dir / _build_key(source, compiler) / f"lib{name}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    private = lib.parent / f".{os.getpid()}.{threading.get_ident()}"
    obj, so = private.with_suffix(".o"), private.with_suffix(".so")
    # Two steps: -fopenmp at link time would add -lgomp, i.e. the system's runtime.
    try:
        _run([compiler, *COMPILE_FLAGS, "-c", str(source), "-o", str(obj)])
        _run([compiler, "-shared", str(obj), "-o", str(so), "-lm"])
        os.replace(so, lib)
    finally:
        obj.unlink(missing_ok=True)
        so.unlink(missing_ok=True)
    return lib


def _build_key(source: Path, compiler: str) -> str:
    """The source, the headers beside it (which it may include), the flags, the compiler."""
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):
        digest.update(header.read_bytes())
    digest.update(" ".join(COMPILE_FLAGS).encode())
    digest.update(_compiler_version(compiler).encode())
    return digest.hexdigest()[:16]


def _compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                              timeout=30, check=False)
    except OSError as exc:
        raise NativeBuildError(f"the C compiler {compiler!r} does not run: {exc}") from exc
    return f"{compiler}\n{done.stdout}"


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeBuildError(f"{' '.join(cmd)} failed: {exc}") from exc
    if done.returncode:
        raise NativeBuildError(f"{' '.join(cmd)} failed:\n{done.stderr}")


def _open(path: Path) -> ctypes.CDLL:
    with _lock:
        if path not in _loaded:
            runtime = torch_openmp_runtime()
            if not runtime.exists():
                raise NativeBuildError(f"torch's OpenMP runtime is not at {runtime}")
            ctypes.CDLL(str(runtime), mode=ctypes.RTLD_GLOBAL)
            try:
                _loaded[path] = ctypes.CDLL(str(path))
            except OSError as exc:
                raise NativeBuildError(f"{path} does not load: {exc}") from exc
        return _loaded[path]


def torch_openmp_runtime() -> Path:
    return Path(torch.__file__).parent / "lib" / "libgomp.so.1"


def mapped_openmp_runtimes() -> set[str]:
    """Paths of the OpenMP runtimes mapped into this process (one is what we want)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    return {p for p in paths if any(name in Path(p).name for name in ("libgomp", "libiomp", "libomp"))}
