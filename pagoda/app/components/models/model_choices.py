"""The models the picker offers, each described (format, quantization, size on disk, memory) off
the GUI thread. Sizes read as the models table writes them ("98.4 MB"); a mixture of experts'
entry also says its parameters and those a token reads ("30.5B, 3.4B active")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pagoda.app.backends.services.model_files import (
    EngineError,
    ModelLoadError,
    default_model_file,
    describe_headers,
    model_name,
    read_model_headers,
)
from pagoda.app.components.models.local_models import size_on_disk
from pagoda.app.components.models.model_library import (
    format_parameters,
    format_size,
    parameter_counts,
)

if TYPE_CHECKING:
    from pagoda.app.backends.services.model_files import EngineConfig, ModelHeaders, ModelInfo

# What the open dialog lists: a .gguf file, or a model folder picked by its config.json.
MODEL_FILE_FILTER = "Models (*.gguf config.json);;GGUF files (*.gguf);;Model folders (config.json)"
DEFAULT_MODEL_LABEL = "bundled"
_FORMAT_LABELS = {"gguf": "GGUF", "safetensors": "safetensors"}


@dataclass(slots=True, frozen=True)
class ModelChoice:
    """One picker entry. source: a path, or None for the bundled default; info is None while
    the model is being read, and error says why it could not be. size_bytes: its files' size
    on disk, the one figure a dense model's entry shows, as the models table does; a mixture
    of experts' also shows its parameters, total and active. The memory its weights take under
    the chosen quantization is in the tooltip."""

    source: str | None
    name: str
    info: ModelInfo | None = None
    error: str = ""
    size_bytes: int = 0

    @property
    def text(self) -> str:
        name = f"{self.name} ({DEFAULT_MODEL_LABEL})" if self.source is None else self.name
        if self.error:
            return f"{name} · unreadable"
        if self.info is None:
            return f"{name} · reading…"
        info = self.info
        text = (f"{name} · {_FORMAT_LABELS[info.format]} · {quantization_text(info)} · "
                f"{format_size(self.size_bytes)}")
        if info.routing is None:
            return text
        return f"{text} · {parameter_counts(info.num_parameters, info.num_active_parameters)}"

    @property
    def tooltip(self) -> str:
        if self.error:
            return self.error
        if self.info is None:
            return self.source or "The bundled default model"
        info = self.info
        text = (f"{info.path}\n{format_parameters(info.num_parameters)} parameters, "
                f"{quantization_text(info)}: {format_size(self.size_bytes)} on disk, "
                f"{format_size(info.weight_bytes)} of weights in memory")
        if info.routing is None:
            return text
        routing = info.routing
        return (f"{text}, {format_size(info.mapped_bytes)} of it experts memory-mapped from the "
                f"file\nA mixture of experts: each token goes through {routing.num_used} of "
                f"{routing.num_experts} experts, {format_parameters(info.num_active_parameters)} "
                f"parameters ({format_size(info.active_bytes)} of weights) a token")


def quantization_text(info: ModelInfo) -> str:
    if info.quantization == info.file_quantization:
        return info.quantization
    return f"{info.quantization} (from {info.file_quantization})"


def model_source_from_selection(selected: str) -> str:
    """What the open dialog returned, as a model source: a .gguf file, or the folder of a chosen
    config.json (or a chosen folder that holds one). Only stats the path."""
    path = Path(selected).expanduser()
    if path.name == "config.json":
        path = path.parent
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a model folder: it has no config.json. Choose a "
                                 "Hugging Face model folder's config.json, or a .gguf file.")
        return str(path)
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise ModelLoadError(f"{path} is not a model: choose a .gguf file, or the config.json "
                             "of a Hugging Face model folder.")
    return str(path)


class ModelChoices:
    """Describes models under the quantization the next load will use. A model's headers are
    read once (seconds for a GGUF) on a thread of their own, so a read never holds up a load;
    each setting then costs nothing. `engine_config` gives the compute dtype; it is called only
    once a read has imported the engine."""

    def __init__(self, engine_config: Callable[[], EngineConfig]) -> None:
        self._engine_config = engine_config
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-models")
        self._reads: dict[str | None, asyncio.Future[_Read | str]] = {}

    def known(self, source: str | None, quantization: str) -> ModelChoice:
        """The entry as far as it is known now, without reading anything."""
        read = self._reads.get(source)
        if read is None or not read.done() or read.cancelled():
            return ModelChoice(source, _name_of(source))
        return self._choice(source, read.result(), quantization)

    async def describe(self, source: str | None, quantization: str) -> ModelChoice:
        if source not in self._reads:
            loop = asyncio.get_running_loop()
            self._reads[source] = loop.run_in_executor(self._executor, _read, source)
        # Shielded: a caller that gives up does not cancel the read others share.
        read = await asyncio.shield(self._reads[source])
        return self._choice(source, read, quantization)

    def _choice(self, source: str | None, read: _Read | str, quantization: str) -> ModelChoice:
        if isinstance(read, str):
            return ModelChoice(source, _name_of(source), error=read)
        info = describe_headers(read.headers, quantization, self._engine_config())
        return ModelChoice(source, info.name, info, size_bytes=read.size_bytes)

    def close(self, wait: bool = False) -> None:
        """Reads not begun are dropped; wait: until the one under way (seconds for a GGUF) ends
        too, for whoever must not leave a thread reading (the tests, between windows)."""
        self._executor.shutdown(wait=wait, cancel_futures=True)


@dataclass(slots=True, frozen=True)
class _Read:
    headers: ModelHeaders
    size_bytes: int


def _read(source: str | None) -> _Read | str:
    """On the reader's thread, which may be the first to import the engine."""
    try:
        headers = read_model_headers(source)
        return _Read(headers, size_on_disk(headers.path))
    except EngineError as error:
        return str(error)
    except OSError as error:
        return f"{source or 'The bundled model'} could not be read: {error.strerror or error}"


def _name_of(source: str | None) -> str:
    """The name the loader will give the model; only stats the path."""
    try:
        return model_name(Path(source) if source else default_model_file())
    except EngineError:
        return source or "the default model"
