"""A fake engine for the app's tests, driven by the test: what it streams, when its tokenizer
holds, when its shutdown ends. The host wraps it in a LocalBackend like the real one."""

import asyncio
import threading

from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.chat.chat_tab import ChatTab
from pagoda.app.qt.chat.controller import ChatController
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.store import ConversationStore, SamplingSettings
from pagoda.engine import EngineDeadError
from pagoda.engine.llm_engine import EngineStats
from pagoda.engine.outputs import CompletionOutput, PromptProgress, RequestMetrics, RequestOutput
from pagoda.engine.text.chat_tokenizer import ChatTokenizer

WAIT_MS = 5_000


class Gate:
    """Holds the tokenizer's `hold_call`-th call until released; the tokenizer's copies share it."""

    def __init__(self) -> None:
        self.calls = 0
        self.hold_call: int | None = None
        self.holding = threading.Event()
        self.release = threading.Event()

    def __deepcopy__(self, memo):
        return self

    def pass_through(self) -> None:
        self.calls += 1
        if self.calls == self.hold_call:
            self.holding.set()
            self.release.wait(WAIT_MS / 1000)


class FakeTokenizer:
    """The parts of a Hugging Face tokenizer pagoda.engine.text.chat_template reads: a real template, which
    joins the messages' texts with spaces."""

    chat_template = "{{ messages | map(attribute='content') | join(' ') }}"
    name_or_path = "fake"

    def __init__(self) -> None:
        self.gate = Gate()
        self.special_tokens_map: dict[str, str] = {}

    def get_chat_template(self) -> str:
        return self.chat_template

    def encode(self, text, add_special_tokens):
        self.gate.pass_through()
        return list(range(len(text.split())))


class FakeEngine:
    """Streams what the test says; shutdown ends its streams with "abort", as AsyncEngine's does."""

    def __init__(self, name: str, tokenizer: FakeTokenizer | None = None) -> None:
        self.model_name = name
        self.max_model_len = self.usable_context_len = 2048
        self.image_prompt = None  # text only
        self.model_created = 0
        self.tokenizer = tokenizer or FakeTokenizer()
        self.chat_tokenizer = ChatTokenizer(self.tokenizer)
        self.requests: list[str] = []
        self.stopped = False
        self.shutdown_started = threading.Event()
        self.release_shutdown = threading.Event()
        self.release_shutdown.set()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}

    @property
    def chat_template(self) -> str:
        return self.tokenizer.chat_template

    def token_text(self, token_ids: list[int]) -> str:
        return " ".join(str(t) for t in token_ids)

    async def stream(self, prompt, params, request_id, cache_tag=None, images=()):
        if self.stopped:
            raise EngineDeadError("the engine was shut down")
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        self._streams[request_id] = (loop, queue)
        self.requests.append(request_id)
        text = ""
        while True:
            delta, reason, error, progress = await queue.get()
            text += delta
            out = output(request_id, text, delta, reason, error)
            out.prompt_progress = progress
            yield out
            if reason is not None:
                return

    def say(self, request_id: str, delta: str, reason: str | None = None,
            error: str | None = None) -> None:
        """Stream `delta`; a `reason` ends the reply ("error" with the engine's `error`)."""
        self._put(request_id, (delta, reason, error, None))

    def read(self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int) -> None:
        """Report a chunk of the prompt read, as the engine does mid-prefill."""
        progress = PromptProgress(num_prompt_tokens, num_computed_tokens, 0, 0.1)
        self._put(request_id, ("", None, None, progress))

    def _put(self, request_id: str, item: tuple) -> None:
        loop, queue = self._streams[request_id]
        loop.call_soon_threadsafe(queue.put_nowait, item)

    def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self.say(request_id, "", "abort")

    def clear_disk_cache(self) -> bool:
        return False  # keeps no blocks on disk

    def flush_disk_cache(self, timeout: float = 10.0) -> bool:
        return False

    def shutdown(self, timeout: float = 10.0) -> None:
        self.shutdown_started.set()
        self.stopped = True
        self.chat_tokenizer.close()
        self.tokenizer.gate.release.set()
        for request_id in list(self._streams):
            self.abort(request_id)
        self.release_shutdown.wait(timeout)

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self._streams), num_waiting=0, kv_cache_usage=0.0,
                           num_kv_blocks=64, prefix_cache_hit_rate=0.0,
                           generation_tokens_per_s=0.0, num_preemptions=0)


class IdleEngine:
    """An engine that is loaded and never asked for a reply: for tests of loading, switching and
    serving, which only need its name, its stats and its shutdown."""

    def __init__(self, name: str) -> None:
        self.model_name = name
        self.max_model_len = self.usable_context_len = 2048
        self.image_prompt = None  # text only
        self.model_created = 0
        self.stopped = False

    def clear_disk_cache(self) -> bool:
        return False  # keeps no blocks on disk

    def flush_disk_cache(self, timeout: float = 10.0) -> bool:
        return False

    def shutdown(self, timeout: float = 10.0) -> None:
        self.stopped = True

    def check_health(self) -> None:
        pass

    def stats(self) -> EngineStats:
        return EngineStats(num_running=0, num_waiting=0, kv_cache_usage=0.0, num_kv_blocks=1,
                           prefix_cache_hit_rate=0.0, generation_tokens_per_s=0.0,
                           num_preemptions=0)


def output(request_id, text, delta, reason, error=None):
    completion = CompletionOutput(0, text, list(range(len(text.split()))), reason, delta,
                                  error=error)
    return RequestOutput(request_id, None, [1, 2, 3], [completion], reason is not None, 0,
                         RequestMetrics(arrival_time=0.0, first_token_time=0.0,
                                        finished_time=1.0))


class FakeModels:
    """The host's factory: one fake engine per model name; a load waits while `gate` is clear."""

    def __init__(self) -> None:
        self.built: dict[str | None, FakeEngine] = {}
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, model, config, on_progress):
        self.gate.wait(WAIT_MS / 1000)
        engine = FakeEngine(model or "first")
        self.built[model] = engine
        return engine


def open_tab(qtbot, tmp_path, run_async):
    """Yields a tab's controller over a fresh database and a host serving the fake "first"
    model (its factory is `controller.models`); closes them after."""
    models = FakeModels()
    host = EngineHost(factory=models)
    db = AsyncStore(ConversationStore.open(tmp_path / "chats.db"))
    conversation = db.store.create_conversation(
        sampling=SamplingSettings(temperature=0.0, max_tokens=16))
    view = ChatTab(conversation.id)
    qtbot.addWidget(view)
    controller = ChatController(ChatSession(conversation.id, db, host), view)
    qtbot.waitUntil(host.load(None).done, timeout=WAIT_MS)
    run_async(controller.open())
    controller.models = models
    yield controller
    controller.close()
    host.shutdown()
    db.close()
