"""`AsyncEngine`: the step loop on one background thread, streams on the caller's asyncio loop.

The engine thread also builds the engine (loads the weights, measures each layer's kernel path,
calibrates): every torch operator of a served model runs on that one thread. A process where a
second thread has run torch work holds two OpenMP thread teams on the same cores, and on some
CPUs each operator of the engine thread then waits for its team's wake-up (a 4x slower int4
matmul was measured on a 2-core Zen 5); the measurements taken at load would also be made on
the wrong thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Self

from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import EngineDeadError, RequestAbortedError, RequestFailedError
from pagoda.engine.llm_engine import EngineStats, LLMEngine
from pagoda.engine.multimodal.images import DecodedImage
from pagoda.engine.multimodal.placeholders import ImagePrompt
from pagoda.engine.outputs import RequestOutput
from pagoda.engine.sampling.params import PoolingParams, SamplingParams
from pagoda.engine.structured_output.compiler import grammar_source
from pagoda.engine.structured_output.workers import GrammarWorkers
from pagoda.engine.text.chat_template import Message, is_conversation
from pagoda.engine.text.chat_tokenizer import ChatTokenizer

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams | PoolingParams
    sink: _Sink
    cache_tag: str | None = None
    grammar: object | None = None  # params.structured_outputs, compiled
    images: tuple[DecodedImage, ...] = ()  # the prompt's, in order (LLMEngine.add_request)


@dataclass(slots=True)
class _Abort:
    request_id: str


_STOP = object()
# While requests run, `stats()` is refreshed at most this often (~45 us of the engine thread's
# Python each time, ~0.5% of a 135M step); when the engine goes idle, before its last outputs
# are sent.
_STATS_INTERVAL_S = 0.1
# A loop is woken at most this often for outputs that can wait: ~60 times a second, what a
# window repaints. A stream's first output, its last and errors go at once, and nothing waits
# behind a step that may be long (the last step took longer, or a request just arrived). At
# 135M a token is ~7.5 ms and waking the loop for each one cost 2.4-5.3% of the decode rate:
# the loop thread's wake-up lands on a core the step's two threads use.
_WAKE_INTERVAL_S = 1 / 60


class _Sink:
    """Delivers one request's outputs (or its error) onto the loop that awaits them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.started = False  # whether anything was sent to it yet: its first output never waits


class _Outbox:
    """What the engine thread has for the streams' loops, in the order it was posted, sent
    with one wake-up per loop: a step's outputs for 32 streams of one loop wake it once, not
    32 times (each wake-up a write to its self-pipe, on the engine thread); and outputs that
    can wait, at most every _WAKE_INTERVAL_S per loop."""

    def __init__(self) -> None:
        self._posted: list[tuple[_Sink, RequestOutput | BaseException]] = []
        self._woken: dict[asyncio.AbstractEventLoop, float] = {}  # recently, when

    def post(self, sink: _Sink, item: RequestOutput | BaseException) -> None:
        self._posted.append((sink, item))

    def send(self, now: float, hold: bool = False) -> None:
        """hold: a loop woken less than _WAKE_INTERVAL_S ago keeps what can wait until a later
        send (the next step's); else everything goes."""
        if not self._posted:
            return
        posted, self._posted = self._posted, []
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for sink, item in posted:
            by_loop.setdefault(sink.loop, []).append((sink, item))
        for loop, batch in by_loop.items():
            if hold and now - self._woken.get(loop, -math.inf) < _WAKE_INTERVAL_S and not any(
                    _urgent(sink, item) for sink, item in batch):
                self._posted.extend(batch)
                continue
            self._woken[loop] = now
            for sink, _ in batch:
                sink.started = True
            try:
                loop.call_soon_threadsafe(_put_all, [(sink.queue, item) for sink, item in batch])
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                pass
        self._woken = {loop: t for loop, t in self._woken.items()
                       if now - t < _WAKE_INTERVAL_S}  # no closed loop is kept


def _urgent(sink: _Sink, item: RequestOutput | BaseException) -> bool:
    return not sink.started or isinstance(item, BaseException) or item.finished


def _put_all(batch: list[tuple[asyncio.Queue, RequestOutput | BaseException]]) -> None:
    for queue_, item in batch:
        queue_.put_nowait(item)


class _Consumer:
    """Ties a stream's request to the task reading it: when that task ends with the request
    unfinished (it broke out of `async for` and kept the generator), the request is aborted."""

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self._engine = engine
        self._request_id = request_id
        self._task: asyncio.Task | None = None

    def follow(self, task: asyncio.Task | None) -> None:
        if task is self._task:
            return
        self.release()
        self._task = task
        if task is not None:
            task.add_done_callback(self._task_done)

    def release(self) -> None:
        if self._task is not None:
            self._task.remove_done_callback(self._task_done)
            self._task = None

    def _task_done(self, _task: asyncio.Task) -> None:
        self._task = None
        self._engine.abort(self._request_id)


EngineBuilder = Callable[[], LLMEngine]


class AsyncEngine:
    """One engine thread builds the engine and serves every stream. Use
    `async for out in engine.stream(...)`.

    `AsyncEngine(model, config)` loads the model on the engine thread; `build=` gives another
    way to make the engine (the window's loader, which reports progress), also run there. The
    constructor returns once the engine is built and raises what building it raised.
    `engine=` adopts one already built on the caller's thread (tests sharing loaded weights):
    it serves, but its torch work then spans two threads (see the module)."""

    def __init__(self, model: str | os.PathLike | None = None, config: EngineConfig | None = None,
                 *, engine: LLMEngine | None = None, build: EngineBuilder | None = None) -> None:
        if engine is not None and build is not None:
            raise ValueError("AsyncEngine takes engine= or build=, not both")
        if build is None:
            build = (lambda: engine) if engine is not None else _loader(model, config)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, _Sink] = {}
        self._outbox = _Outbox()  # the engine thread's only
        self._stats_due = 0.0  # when the engine thread next refreshes _stats while busy
        self._arrived = False  # a request was added since the last send (its prefill is next)
        self._ids = itertools.count()
        self._dead: BaseException | None = None
        # Held while a request enters the inbox and while the exiting thread closes it, so no
        # request can slip in after the thread's last look (its stream would never end).
        self._inbox_lock = threading.Lock()
        self._closed = False
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        self._thread = threading.Thread(target=self._build_and_run, args=(build,),
                                        name="pagoda-engine", daemon=True)
        self._thread.start()
        self._built.wait()
        if self._build_error is not None:
            self._thread.join()
            raise self._build_error
        self._stats = self.engine.stats()
        # Chats are encoded on threads of their own, never on the caller's loop (see the
        # module); one far over the context is refused before it is encoded.
        self.chat_tokenizer = ChatTokenizer(self.engine.tokenizer, self.engine.max_model_len)
        # Constraints are compiled in child processes, never on the engine thread: a slow
        # compile delays only its own request, and is stopped at its deadline or when its
        # caller leaves.
        self.grammar_workers = GrammarWorkers(self.engine.vocabulary)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def chat_template(self) -> str | None:
        """The model's chat template (its text), None when it has none."""
        template = getattr(self.engine.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def token_text(self, token_ids: list[int]) -> str:
        """The text tokens spell, read from the vocabulary's bytes: safe on any thread, where
        the tokenizer itself belongs to the engine's."""
        raw = b"".join(self.engine.vocabulary.token_bytes(t) for t in token_ids)
        return raw.decode("utf-8", errors="replace")

    @property
    def model_name(self) -> str:
        """The loaded model's name ("SmolLM2-135M-Instruct"), as the server and the window show it."""
        return self.engine.loaded.name

    @property
    def model_created(self) -> int:
        """When the model's file (or folder) was last written, in Unix seconds: OpenAI's
        `created` of a model; 0 where the path cannot be read."""
        try:
            return int(os.stat(self.engine.loaded.path).st_mtime)
        except (OSError, TypeError, ValueError):
            return 0

    @property
    def max_model_len(self) -> int:
        """The longest sequence (prompt + reply) this engine allows, in tokens."""
        return self.engine.max_model_len

    @property
    def usable_context_len(self) -> int:
        """The longest sequence one request can run: max_model_len, within what the KV cache
        holds (a model with sliding-window layers reaches further at the same memory)."""
        return self.engine.usable_context_len

    @property
    def hidden_size(self) -> int:
        """The width of the vectors `embed` makes."""
        return self.engine.hidden_size

    @property
    def image_prompt(self) -> ImagePrompt | None:
        """How a chat's images become the prompt's placeholders; None: the model takes text
        only."""
        return self.engine.image_prompt

    def clear_disk_cache(self) -> bool:
        """Drop the prefix cache's blocks on disk, and those queued for it; False when the engine
        keeps none (no folder configured). Any thread: the tier locks its own state."""
        disk = self.engine.disk_cache
        if disk is None:
            return False
        disk.clear()
        return True

    def flush_disk_cache(self, timeout: float = 10.0) -> bool:
        """Wait until the blocks queued for the disk are written; False when the engine keeps
        none, or the wait ran out. Any thread."""
        disk = self.engine.disk_cache
        return disk is not None and disk.flush(timeout)

    async def stream(self, prompt: str | list[int] | Sequence[Message],
                     params: SamplingParams | None = None,
                     request_id: str | None = None,
                     cache_tag: str | None = None,
                     images: Sequence[DecodedImage] = ()) -> AsyncIterator[RequestOutput]:
        """Yield incremental outputs until the request finishes (the last has finished=True).
        `cache_tag` names what the request belongs to, `images` the prompt's images in the
        order of their placeholders (see LLMEngine.add_request).

        Raises EngineDeadError at once when the engine has stopped or is stopping. The request
        belongs to the task reading the stream: it is aborted when that task ends, or the stream
        is closed or collected, before the last output."""
        self.check_health()
        if is_conversation(prompt):
            prompt = await self.chat_tokenizer.encode_chat(prompt)
        params = params or SamplingParams()
        grammar = await self.compile_grammar(params)
        request_id = request_id or f"stream-{next(self._ids)}"
        sink = _Sink(asyncio.get_running_loop())
        self._submit(_Add(request_id, prompt, params, sink, cache_tag, grammar, tuple(images)))
        consumer = _Consumer(self, request_id)
        finished = False
        try:
            while not finished:
                consumer.follow(asyncio.current_task())
                item = await sink.queue.get()
                if isinstance(item, BaseException):
                    # The request was never added (a duplicate id names someone else's request)
                    # or the engine died: there is nothing of ours to abort.
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            consumer.release()
            if not finished:
                self.abort(request_id)

    async def embed(self, prompts: Sequence[list[int]], params: PoolingParams | None = None,
                    request_id: str | None = None) -> list[list[float]]:
        """One vector per prompt (token ids), in order: each prompt is a pooling request
        (see PoolingParams), named f"{request_id}-{i}", that the engine thread reads in steps
        shared with every other request.

        Raises what adding a prompt raised (ValueError, PromptTooLongError), EngineDeadError,
        RequestAbortedError when one was aborted, RequestFailedError when its step failed.
        Then, or when the awaiting task is cancelled, the prompts' other requests are aborted."""
        self.check_health()
        params = params or PoolingParams()
        request_id = request_id or f"embed-{next(self._ids)}"
        request_ids = [f"{request_id}-{i}" for i in range(len(prompts))]
        loop = asyncio.get_running_loop()
        sinks = [_Sink(loop) for _ in prompts]
        vectors: list[list[float]] = []
        try:
            for rid, prompt, sink in zip(request_ids, prompts, sinks, strict=True):
                self._submit(_Add(rid, list(prompt), params, sink))
            for sink in sinks:
                vectors.append(await _pooled(sink))
            return vectors
        finally:
            if len(vectors) < len(sinks):
                for rid in request_ids[len(vectors):]:
                    self.abort(rid)

    async def compile_grammar(self, params: SamplingParams) -> object | None:
        """params.structured_outputs compiled in a child process (None without one), or found
        compiled; StructuredOutputError naming the problem when it cannot be, or when it takes
        longer than `grammar_workers.timeout_s`. Cancelling the awaiting task stops the compile."""
        constraint = params.structured_outputs
        if constraint is None:
            return None
        compiler = self.engine.grammar_compiler
        compiled = compiler.cached(constraint)
        if compiled is None:
            compiled = await self.grammar_workers.compile(*grammar_source(constraint))
            compiler.keep(constraint, compiled)
        return compiled

    def abort(self, request_id: str) -> None:
        """Stop a request at once; its stream ends with finish_reason "abort"."""
        self._inbox.put(_Abort(request_id))

    def stats(self) -> EngineStats:
        return self._stats

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort everything in flight and stop the engine thread; from now on `stream` raises
        EngineDeadError, even while the thread finishes its last step."""
        with self._inbox_lock:
            if self._dead is None:
                self._dead = EngineDeadError("the engine was shut down")
        self.chat_tokenizer.close()
        self.grammar_workers.close()
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def check_health(self) -> None:
        """Raises EngineDeadError when the engine can serve no more requests."""
        if self._dead is not None or not self._thread.is_alive():
            raise EngineDeadError(f"the engine thread has stopped ({self._dead!r}); restart it")

    def _submit(self, msg: _Add) -> None:
        with self._inbox_lock:
            if self._closed or self._dead is not None:
                raise EngineDeadError(f"the engine thread has stopped ({self._dead!r}); "
                                      "restart it")
            self._inbox.put(msg)

    def _build_and_run(self, build: EngineBuilder) -> None:
        try:
            self.engine = build()
        except BaseException as exc:  # noqa: BLE001 - raised again on the constructor's thread
            self._build_error = exc
            return
        finally:
            self._built.set()
        self._run()

    def _run(self) -> None:
        try:
            while self._handle_inbox():
                short_step = False
                if self.engine.has_unfinished_requests():
                    started = time.monotonic()
                    self._deliver(self.engine.step())
                    short_step = time.monotonic() - started < _WAKE_INTERVAL_S
                busy = self.engine.has_unfinished_requests()
                now = time.monotonic()
                if not busy or now >= self._stats_due:
                    self._stats = self.engine.stats()
                    self._stats_due = now + _STATS_INTERVAL_S
                # What can wait, waits only for another step like the last (short, no arrival).
                self._outbox.send(now, hold=busy and short_step and not self._arrived)
                self._arrived = False
        except BaseException as exc:
            logger.exception("engine thread died")
            self._dead = exc
            for sink in self._sinks.values():
                self._outbox.post(sink, EngineDeadError(f"the engine thread died: {exc!r}"))
        finally:
            self._abort_all()
            self._close_inbox()
            self._outbox.send(time.monotonic())
            self.engine.close()

    def _close_inbox(self) -> None:
        """Fail every request still queued: nothing will run it."""
        with self._inbox_lock:
            self._closed = True
            if self._dead is None:
                self._dead = EngineDeadError("the engine thread stopped")
        reason = self._dead if isinstance(self._dead, EngineDeadError) else EngineDeadError(
            f"the engine thread died: {self._dead!r}")
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, _Add):
                self._outbox.post(msg.sink, reason)

    def _handle_inbox(self) -> bool:
        """Apply pending adds and aborts; block only while there is nothing to compute."""
        block = not self.engine.has_unfinished_requests()
        while True:
            try:
                msg = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if msg is _STOP:
                return False
            if isinstance(msg, _Add):
                self._arrived = True
                self._add(msg)
            else:
                self._abort(msg.request_id)

    def _add(self, msg: _Add) -> None:
        try:
            self.engine.add_request(msg.request_id, msg.prompt, msg.params, msg.cache_tag,
                                    msg.grammar, msg.images)
        except Exception as exc:  # noqa: BLE001 - a bad request fails its own stream only
            self._outbox.post(msg.sink, exc)
            return
        self._sinks[msg.request_id] = msg.sink

    def _abort(self, request_id: str) -> None:
        out = self.engine.abort_request(request_id)
        sink = self._sinks.pop(request_id, None)
        if out is not None and sink is not None:
            self._outbox.post(sink, out)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            sink = self._sinks.get(out.request_id)
            if sink is None:
                continue
            self._outbox.post(sink, out)
            if out.finished:
                del self._sinks[out.request_id]

    def _abort_all(self) -> None:
        for request_id in list(self._sinks):
            self._abort(request_id)


async def _pooled(sink: _Sink) -> list[float]:
    """The vector of the pooling request whose outputs `sink` receives."""
    while True:
        item = await sink.queue.get()
        if isinstance(item, BaseException):
            raise item
        if item.finished:
            return _embedding(item)


def _embedding(out: RequestOutput) -> list[float]:
    if out.embedding is not None:
        return out.embedding
    completion = out.outputs[0]
    if completion.finish_reason == "abort":
        raise RequestAbortedError(f"the pooling request {out.request_id!r} was aborted before "
                                  "its vector was made")
    raise RequestFailedError(f"the pooling request {out.request_id!r} ended "
                             f"({completion.finish_reason}) without its vector: "
                             f"{completion.error or 'no error was given'}")


def _loader(model: str | os.PathLike | None, config: EngineConfig | None) -> EngineBuilder:
    return lambda: LLMEngine(None if model is None else str(model), config)
