"""Owns the app's one engine: loads it off the GUI thread, swaps models, reports its status.
The rest of the app reaches it through the ChatBackend seam (a LocalBackend over it)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal

from pagoda.app.backends import ChatBackend, ModelLoadingError, chat_cache_tag
from pagoda.app.backends.services.engine_import import ENGINE_IMPORT_LOCK
from pagoda.app.backends.services.local_engine import (
    DEFAULT_DISK_CACHE_BYTES,
    LOAD_STEPS,
    QUANTIZATIONS,
    EngineConfig,
    EngineError,
    EngineFactory,
    LoadProgress,
    clear_folder,
    disk_kv_cache_dir,
    folder_size,
    forget_tag,
    make_local_engine,
    resident_bytes,
)
from pagoda.app.backends.services.model_files import (
    default_model_file,
    model_name,
    refuse_unrunnable_model,
)
from pagoda.app.components.shared.view_models import EngineStatusView, LoadStepView

if TYPE_CHECKING:
    from pagoda.app.backends.services.local_engine import AsyncEngine

logger = logging.getLogger(__name__)

STATS_INTERVAL_MS = 250
SPECULATIVE_TOKENS = 2


class EngineHost(QObject):
    """The GUI's handle on the engine. `backend`, the loaded engine behind a LocalBackend, is
    None until a model has loaded.

    A request starts on `backend_for_new_request()`, never on a kept reference: from the start
    of a load until the old engine has shut down it hands out no backend, so no tab starts a
    request on an engine about to stop.

    `quantization` is the setting the next load uses; `loaded_quantization` the one the running
    model was loaded with. `disk_cache_dir` (None: off) and `disk_cache_bytes` are where the
    next load keeps the prefix cache across restarts, and how much of it.

    Signals: `status_changed(EngineStatusView)` a few times a second and on every state change;
    `availability_changed()` when whether `backend_for_new_request` hands out a backend may
    have changed (a load began or ended); `model_loaded(str)` with the model's name;
    `load_failed(str)` with the loader's message. A load is over (`is_loading` False) before
    the last two fire, so their listeners see the state after it. While it goes on, the status
    says which of LOAD_STEPS it is at, and how far into it where the step has a measure;
    `loading_model` is the model it loads (None: the bundled one).
    """

    status_changed = Signal(object)
    availability_changed = Signal()
    model_loaded = Signal(str)
    load_failed = Signal(str)
    # A LoadProgress, emitted from the loading thread; Qt queues it onto the GUI thread.
    _progress = Signal(object)

    def __init__(self, device: str = "cpu", factory: EngineFactory = make_local_engine,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.device = device
        self.backend: ChatBackend | None = None
        self.model_path: str | None = None
        self.loading_model: str | None = None
        self.quantization = "auto"
        self.loaded_quantization = "auto"
        self.disk_cache_dir: Path | None = disk_kv_cache_dir()
        self.disk_cache_bytes = DEFAULT_DISK_CACHE_BYTES
        self._factory = factory
        # Our own threads, not the loop's default executor: loading, swapping, writing files.
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pagoda-host")
        self._loading: asyncio.Task | None = None
        self._is_loading = False  # from load() until the load's outcome is published
        self._load_started = 0.0  # time.perf_counter() at the last load()
        self._status = EngineStatusView(state="loading", device=device, load=_load_step(0))
        # Polls the engine's figures once a model serves, and this process's memory always
        # (it grows while a model loads).
        self._timer = QTimer(self, interval=STATS_INTERVAL_MS, timeout=self._poll_stats)
        self._timer.start()
        self._progress.connect(self._show_progress)

    @property
    def status(self) -> EngineStatusView:
        return self._status

    @property
    def is_ready(self) -> bool:
        return self.backend is not None

    @property
    def model_name(self) -> str:
        return self.backend.model_name if self.backend else ""

    @property
    def max_model_len(self) -> int:
        return self.backend.max_model_len if self.backend else 0

    @property
    def is_loading(self) -> bool:
        return self._is_loading

    def backend_for_new_request(self) -> ChatBackend:
        """The backend to start a request on now; raises ModelLoadingError while there is none."""
        if self.is_loading:
            raise ModelLoadingError("A model is loading: send again once it is ready.")
        if self.backend is None:
            raise ModelLoadingError("No model is loaded: choose one in the model picker.")
        return self.backend

    @staticmethod
    def known_quantization(value: object) -> str:
        """`value` when the engine knows it as a quantization setting, else "auto" (a setting
        stored by another version)."""
        return value if value in QUANTIZATIONS else "auto"

    def engine_config(self, quantization: str | None = None) -> EngineConfig:
        """The EngineConfig a load builds its engine with: under `quantization`, else the
        setting. It imports torch: call it on the GUI thread only once a model has loaded."""
        # Prompt lookup with up to 2 drafts; each step the engine verifies them only where its
        # measured step cost and the reply's acceptance say they pay (docs/BENCHMARKS.md).
        return EngineConfig(device=self.device, num_speculative_tokens=SPECULATIVE_TOKENS,
                            quantization=quantization or self.quantization,
                            disk_cache_dir=self.disk_cache_dir if self.disk_cache_bytes else None,
                            disk_cache_bytes=self.disk_cache_bytes)

    async def disk_cache_usage(self) -> int:
        """Bytes the prefix cache holds on disk, every model's (0 when it is off)."""
        if self.disk_cache_dir is None:
            return 0
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, folder_size, self.disk_cache_dir)

    async def clear_disk_cache(self) -> int:
        """Remove every block the prefix cache keeps on disk, the running engine's queue
        included; returns what is left on disk (0, unless a file could not be removed)."""
        if self.disk_cache_dir is None:
            return 0
        backend = self.backend

        def clear() -> None:
            # The running engine also drops what it has queued; without one, the folder alone.
            if backend is None or not backend.clear_disk_cache():
                clear_folder(self.disk_cache_dir)

        await asyncio.get_running_loop().run_in_executor(self.executor, clear)
        return await self.disk_cache_usage()

    async def forget_chat_blocks(self, conversation_id: int) -> int:
        """Remove the blocks on disk that only this (deleted) conversation used, every model's;
        returns how many. What the running engine has queued is written first, so none of the
        chat's blocks comes back after."""
        if self.disk_cache_dir is None:
            return 0
        backend, folder = self.backend, self.disk_cache_dir

        def forget() -> int:
            if backend is not None:
                backend.flush_disk_cache()
            return forget_tag(folder, chat_cache_tag(conversation_id))

        return await asyncio.get_running_loop().run_in_executor(self.executor, forget)

    def forget_chat_blocks_at_exit(self, conversation_id: int) -> int:
        """`forget_chat_blocks` on this thread, for the app's exit, after `shutdown` (the engine
        wrote what it had queued as it stopped)."""
        if self.disk_cache_dir is None:
            return 0
        return forget_tag(self.disk_cache_dir, chat_cache_tag(conversation_id))

    def load(self, model: str | None = None) -> asyncio.Task:
        """Load a model in the background; the current one keeps serving until it succeeds."""
        if self.is_loading:
            raise EngineError("a model is already loading: wait for it to finish")
        self._is_loading = True
        self.loading_model = model
        self._load_started = time.perf_counter()
        self._loading = asyncio.ensure_future(self._load(model))
        self.availability_changed.emit()
        return self._loading

    async def _load(self, model: str | None) -> None:
        try:
            await self._load_and_swap(model)
        finally:
            self._end_load()  # also when cancelled: no tab may wait for a load that is gone

    async def _load_and_swap(self, model: str | None) -> None:
        self._set_status(state="loading", model=_display_name(model), detail="",
                         load=_load_step(0))
        quantization = self.quantization
        loop = asyncio.get_running_loop()
        try:
            engine = await loop.run_in_executor(self.executor, self._build_engine, model,
                                                quantization)
        except Exception as exc:  # noqa: BLE001 - any load failure is reported, the old model stays
            logger.warning("could not load model %s: %s", model or "(default)", exc)
            self._after_failed_load(str(exc))
            return
        from pagoda.app.backends.chat.local import (
            LocalBackend,  # imported by _build_engine, off this thread
        )

        await self._swap(LocalBackend(engine), model, quantization)

    def _end_load(self) -> None:
        if self._is_loading:
            self._is_loading = False
            self.availability_changed.emit()

    def _build_engine(self, model: str | None, quantization: str) -> AsyncEngine:
        """On the host's thread, where the first load imports the engine (seconds of torch and
        transformers) while the window is already up. A model Pagoda does not run is refused
        before that, from its header or config.json: in milliseconds, with the reason."""
        refuse_unrunnable_model(model)
        with ENGINE_IMPORT_LOCK:
            import pagoda.app.backends.chat.local  # noqa: F401 - the engine behind it; _load wraps the result
        return self._factory(model, self.engine_config(quantization), self._progress.emit)

    def _after_failed_load(self, message: str) -> None:
        self._end_load()
        if self.backend is None:
            self._set_status(state="error", model="", detail=message, load=None)
        else:
            self._set_status(state="ready", model=self.model_name, detail="", load=None)
        self.load_failed.emit(message)

    async def _swap(self, backend: ChatBackend, model: str | None, quantization: str) -> None:
        """Publish the new backend, then retire the old one; the load is not over until it has
        stopped, so `backend_for_new_request` never hands out the old one while it stops."""
        old, self.backend, self.model_path = self.backend, backend, model
        self.loaded_quantization = quantization
        if old is not None:
            # Streams on the old engine end with "abort" (or BackendStoppedError, when still
            # tokenizing); their tabs keep the partial replies.
            await asyncio.get_running_loop().run_in_executor(self.executor, old.shutdown)
        self._end_load()
        logger.info("model %s ready %.2f s after its load began", self.model_name,
                    time.perf_counter() - self._load_started)
        self._set_status(state="ready", model=self.model_name, detail="", load=None)
        self._timer.start()
        self.model_loaded.emit(self.model_name)

    def _show_progress(self, progress: LoadProgress) -> None:
        if self.is_loading:
            self._set_status(load=_load_step(progress.step, progress.fraction))

    def shutdown(self) -> None:
        self._timer.stop()
        if self.backend is not None:
            self.backend.shutdown()
            self.backend = None
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _poll_stats(self) -> None:
        if self.backend is None:
            self._set_status(resident_bytes=resident_bytes())
            return
        s = self.backend.stats()
        self._set_status(resident_bytes=resident_bytes(),
                         num_running=s.num_running, num_waiting=s.num_waiting or 0,
                         tokens_per_s=s.tokens_per_s,
                         kv_cache_usage=s.kv_cache_usage or 0.0,
                         prefix_cache_hit_rate=s.prefix_cache_hit_rate or 0.0,
                         spec_acceptance_rate=s.spec_acceptance_rate,
                         spec_status=s.spec_status, spec_reason=s.spec_reason)

    def _set_status(self, **changes) -> None:
        status = dataclasses.replace(self._status, **changes)
        if status != self._status:
            self._status = status
            self.status_changed.emit(status)


def _load_step(index: int, fraction: float | None = None) -> LoadStepView:
    return LoadStepView(LOAD_STEPS[index], index + 1, len(LOAD_STEPS), fraction)


def _display_name(model: str | None) -> str:
    try:
        return model_name(Path(model) if model else default_model_file())
    except EngineError:
        return model or "the default model"

