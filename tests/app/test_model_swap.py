"""Switching models while tabs generate: no tab is handed the engine being shut down, and a reply
on that engine ends (kept, and said so) instead of hanging. Over a fake engine the test drives."""

import asyncio
import threading

import pytest

from app.async_store import AsyncStore
from app.chat_tab import ChatTab
from app.controller import ChatController
from app.engine_host import EngineHost, ModelLoadingError
from app.store import ConversationStore, SamplingSettings
from engine import EngineDeadError
from engine.llm_engine import EngineStats
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput

WAIT_MS = 5_000


class _Tokenizer:
    chat_template = "plain"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return " ".join(m["content"] for m in messages)

    def encode(self, text, add_special_tokens):
        return list(range(len(text.split())))


class _FakeEngine:
    """Streams what the test says; shutdown ends its streams with "abort", as AsyncEngine's does."""

    def __init__(self, name: str) -> None:
        self.engine = type("E", (), {"loaded": type("L", (), {"name": name})(),
                                     "max_model_len": 2048})()
        self.tokenizer = _Tokenizer()
        self.requests: list[str] = []
        self.stopped = False
        self.shutdown_started = threading.Event()
        self.release_shutdown = threading.Event()
        self.release_shutdown.set()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}

    async def stream(self, prompt, params, request_id):
        if self.stopped:
            raise EngineDeadError("the engine was shut down")
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        self._streams[request_id] = (loop, queue)
        self.requests.append(request_id)
        text = ""
        while True:
            delta, reason = await queue.get()
            text += delta
            yield _output(request_id, text, delta, reason)
            if reason is not None:
                return

    def say(self, request_id: str, delta: str, reason: str | None = None) -> None:
        loop, queue = self._streams[request_id]
        loop.call_soon_threadsafe(queue.put_nowait, (delta, reason))

    def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self.say(request_id, "", "abort")

    def shutdown(self, timeout: float = 10.0) -> None:
        self.shutdown_started.set()
        self.stopped = True
        for request_id in list(self._streams):
            self.abort(request_id)
        self.release_shutdown.wait(timeout)

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self._streams), num_waiting=0, kv_cache_usage=0.0,
                           num_kv_blocks=64, prefix_cache_hit_rate=0.0,
                           generation_tokens_per_s=0.0, num_preemptions=0)


def _output(request_id, text, delta, reason):
    completion = CompletionOutput(0, text, list(range(len(text.split()))), reason, delta)
    return RequestOutput(request_id, None, [1, 2, 3], [completion], reason is not None, 0,
                         RequestMetrics(arrival_time=0.0, first_token_time=0.0,
                                        finished_time=1.0))


class _Models:
    """The host's factory: one fake engine per model name; a load waits while `gate` is clear."""

    def __init__(self) -> None:
        self.built: dict[str | None, _FakeEngine] = {}
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, model, config, on_progress):
        self.gate.wait(WAIT_MS / 1000)
        engine = _FakeEngine(model or "first")
        self.built[model] = engine
        return engine


@pytest.fixture
def tab(qloop, qtbot, tmp_path, run_async):
    """A tab's controller over a fresh database and a host serving the fake "first" model."""
    models = _Models()
    host = EngineHost(factory=models)
    db = AsyncStore(ConversationStore.open(tmp_path / "chats.db"))
    conversation = db.store.create_conversation(
        sampling=SamplingSettings(temperature=0.0, max_tokens=16))
    view = ChatTab(conversation.id)
    qtbot.addWidget(view)
    controller = ChatController(conversation.id, db, host, view)
    qtbot.waitUntil(host.load(None).done, timeout=WAIT_MS)
    run_async(controller.open())
    controller.models = models
    yield controller
    controller.close()
    host.shutdown()
    db.close()


def _gate_assistant_start(controller) -> asyncio.Event:
    """Hold the tab just after its user message is saved, before its reply starts."""
    go = asyncio.Event()
    start = controller.db.start_assistant_message

    async def held(*args, **kwargs):
        await go.wait()
        return await start(*args, **kwargs)

    controller.db.start_assistant_message = held
    return go


def _wait_streaming_on(qtbot, engine):
    qtbot.waitUntil(lambda: bool(engine.requests), timeout=WAIT_MS)
    return engine.requests[-1]


def _last(controller):
    """The newest message of the tab's branch, as stored."""
    path = controller.db.store.current_path(controller.conversation_id)
    return path[-1] if path else None


def test_a_reply_held_up_while_the_model_switched_streams_on_the_new_model(tab, qtbot):
    first = tab.host.backend
    go = _gate_assistant_start(tab)
    tab.spawn(tab.send("Hello"))
    qtbot.waitUntil(lambda: _last(tab) is not None and _last(tab).role == "user",
                    timeout=WAIT_MS)
    qtbot.waitUntil(tab.host.load("second").done, timeout=WAIT_MS)
    go.set()
    second = tab.models.built["second"]
    request_id = _wait_streaming_on(qtbot, second)
    second.say(request_id, "Hi there", "stop")
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    assert first.requests == []
    assert _last(tab).status == "complete" and _last(tab).content == "Hi there"


def test_a_reply_due_to_start_while_a_model_loads_is_refused_and_kept(tab, qtbot):
    first = tab.host.backend
    go = _gate_assistant_start(tab)
    tab.spawn(tab.send("Hello"))
    qtbot.waitUntil(lambda: _last(tab) is not None and _last(tab).role == "user",
                    timeout=WAIT_MS)
    tab.models.gate.clear()
    loading = tab.host.load("second")
    go.set()
    qtbot.waitUntil(lambda: _last(tab).role == "assistant" and _last(tab).status != "streaming",
                    timeout=WAIT_MS)
    tab.models.gate.set()
    qtbot.waitUntil(loading.done, timeout=WAIT_MS)
    assert first.requests == [] and tab.models.built["second"].requests == []
    reply = _last(tab)
    assert reply.status == "error" and "model is loading" in reply.error
    assert "model is loading" in tab.view.notice_text()
    assert [m.content for m in tab.path[:-1]] == ["Hello"]


def test_a_reply_streaming_when_the_model_switches_ends_interrupted_and_says_so(tab, qtbot):
    first = tab.host.backend
    tab.spawn(tab.send("Tell me a story"))
    request_id = _wait_streaming_on(qtbot, first)
    first.say(request_id, "Once upon")
    qtbot.waitUntil(lambda: tab.reply is not None and tab.reply.text == "Once upon",
                    timeout=WAIT_MS)
    qtbot.waitUntil(tab.host.load("second").done, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    reply = _last(tab)
    assert reply.status == "interrupted" and reply.content == "Once upon"
    assert "model was switched" in tab.view.notice_text()
    assert not tab.view.composer._streaming


def test_no_engine_is_handed_out_while_a_model_loads_or_the_old_one_shuts_down(tab, qtbot):
    host, first = tab.host, tab.host.backend
    assert host.engine_for_new_request() is first
    tab.models.gate.clear()
    first.release_shutdown.clear()
    loading = host.load("second")
    with pytest.raises(ModelLoadingError, match="model is loading"):
        host.engine_for_new_request()
    tab.models.gate.set()
    qtbot.waitUntil(first.shutdown_started.is_set, timeout=WAIT_MS)
    with pytest.raises(ModelLoadingError, match="model is loading"):
        host.engine_for_new_request()
    first.release_shutdown.set()
    qtbot.waitUntil(loading.done, timeout=WAIT_MS)
    assert host.engine_for_new_request() is tab.models.built["second"]
