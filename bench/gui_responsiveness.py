"""How long the GUI's event loop stalls while tabs stream at once (target: < 50 ms).

Runs the real window (offscreen unless a display is set) on a temporary database with the default
model. A 5 ms QTimer records the gap between its ticks; a gap far over 5 ms is a stall the user
would feel as a frozen window. Not a test: results go to docs/BENCHMARKS.md.

    .venv/bin/python bench/gui_responsiveness.py [--tabs 3] [--remote-tabs 0] [--tool-tabs 0]
                                                 [--max-tokens 128] [--local-threads N]
                                                 [--remote-cpus N] [--trace-stalls MS]
                                                 [--json out.json]

--tabs counts the tabs answered by the engine in this process. --remote-tabs N adds N tabs
answered by a saved server: Pagoda's own OpenAI-compatible server (`python -m pagoda.engine serve`, the
same default model) started here as a separate process on 127.0.0.1, as a user's second machine
would be, except that it shares this machine's cores. `serve` has no thread option, so the server
is pinned to the last --remote-cpus CPUs and its engine uses one thread per CPU it may run on.
With remote tabs the local engine uses --local-threads (default for both: half the CPUs).
--tool-tabs N adds N tabs answered by a saved server that is a scripted thinking, tool-calling
model (bench/scripted_tool_model.py, a process of its own): it thinks for about 4 s, calls
`clock`, then `hang` (3 s), then answers; the chats' tools are the tests' MCP server
(tests/app/components/tools/mcp_test_server.py, started before the meter, as after a first use).
The bench clicks each call's Run link in the transcript with the mouse, as the user does, and
reports from just before the click to the `clock` call's arrival at the server (its monotonic
clock, the same one as ours), and the stalls while the tool tabs think and while `hang` runs.
--trace-stalls MS samples every thread's stack while the tick is late by more than MS and
reports them per stall, and times the garbage collector's full collections, to find what held
the GUI thread (it costs a little; leave it out of runs whose figures are reported).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = ["Write a short story about a lighthouse keeper.",
           "Explain how a bicycle works, step by step.",
           "用中文介绍一下长城。",
           "List ten ideas for a birthday party.",
           "Describe the water cycle for a child."]
TICK_MS = 5
SERVER_START_TIMEOUT_S = 300
REPLIES_TIMEOUT_S = 600
TOOL_PROMPT = "What time is it on the server? Then wait three seconds, and tell me."
TOOL_MAX_TOKENS = 1024  # room for the scripted model's thinking (400 pieces by default)
MCP_SERVER = "bench"
MCP_TEST_SERVER = ROOT / "tests/app/components/tools/mcp_test_server.py"
SCRIPTED_MODEL = ROOT / "bench/scripted_tool_model.py"
POLL_S = 0.02  # how often the bench looks for a call asking and for a call's result
LOOK_S = 0.2  # from showing a tab to clicking its Run: the least a user takes to find it
CLICK_TIMEOUT_S = 5
CALL_TIMEOUT_S = 60


class StallMeter:
    """Records the gaps between ticks of a fast timer on the GUI thread."""

    def __init__(self) -> None:
        from PySide6.QtCore import QTimer

        self.gaps_ms: list[float] = []
        self.tick_times: list[float] = []  # when each gap ended (perf_counter)
        self.long_gaps: list[tuple[float, float]] = []  # (ended, s after the start; gap in ms)
        self._began = self._last = time.perf_counter()
        self._timer = QTimer(interval=TICK_MS, timeout=self._tick)

    def start(self) -> None:
        self._began = self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    @property
    def last_tick(self) -> float:
        return self._last

    def _tick(self) -> None:
        now = time.perf_counter()
        gap_ms = (now - self._last) * 1000
        self.gaps_ms.append(gap_ms)
        self.tick_times.append(now)
        if gap_ms > 50:
            self.long_gaps.append((round(now - self._began, 3), round(gap_ms, 1)))
        self._last = now


class StallTracer:
    """Samples the GUI thread's stack from a thread of its own while the meter's tick is late by
    more than `threshold_ms`: what the GUI thread ran during each stall, for finding its cause.
    Also times the garbage collector's runs: a full collection holds the GIL throughout, so no
    thread (the sampler neither) runs Python meanwhile, and its stall shows hardly a sample."""

    def __init__(self, meter: StallMeter, threshold_ms: float) -> None:
        self._meter = meter
        self._threshold_s = threshold_ms / 1000
        self._gui_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-tracer", daemon=True)
        self._began = 0.0
        self.stalls: dict[float, collections.Counter] = {}
        self.collections: list[dict] = []  # the collector's runs of the oldest generation
        self._collecting_since = 0.0
        self._collecting_in: list[str] = []  # the thread and frames whose allocation set it off

    def start(self) -> None:
        self._began = time.perf_counter()
        gc.callbacks.append(self._on_gc)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._collecting_since = now
            if info["generation"] == 2:
                self._collecting_in = [threading.current_thread().name, *(
                    f"{Path(f.filename).name}:{f.lineno} {f.name}"
                    for f in traceback.extract_stack(sys._getframe(1))[-6:])]
        elif info["generation"] == 2:
            self.collections.append({"at_s": round(self._collecting_since - self._began, 3),
                                     "ms": round((now - self._collecting_since) * 1000, 1),
                                     "collected": info["collected"],
                                     "set_off_by": self._collecting_in})

    def report(self) -> list[dict]:
        """Each stall: when it began (s after the start) and its stacks, most sampled first."""
        return [{"at_s": round(at - self._began, 3), "samples": sum(stacks.values()),
                 "stacks": [{"samples": n, "frames": list(frames)}
                            for frames, n in stacks.most_common(12)]}
                for at, stacks in sorted(self.stalls.items())]

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            last = self._meter.last_tick
            if time.perf_counter() - last < self._threshold_s:
                continue
            names = {t.ident: t.name for t in threading.enumerate()}
            stacks = self.stalls.setdefault(last, collections.Counter())
            for ident, frame in sys._current_frames().items():
                if ident == threading.get_ident() or _is_idle(frame):
                    continue
                depth = 14 if ident == self._gui_thread else 4
                frames = tuple(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                               for f in traceback.extract_stack(frame)[-depth:])
                stacks[(names.get(ident, "thread"), *frames)] += 1


def _is_idle(frame) -> bool:
    """A thread waiting for work (a pool's queue, an event) cannot be what holds the GIL."""
    return frame.f_code.co_name in ("wait", "_worker", "get") and Path(
        frame.f_code.co_filename).name in ("threading.py", "thread.py", "queue.py")


class ServerProcess:
    """A server in a process of its own on 127.0.0.1 (`command`, then --host and --port), pinned
    to `cpus` when given; stopped on exit."""

    def __init__(self, command: list[str], log_path: Path, cpus: set[int] | None = None) -> None:
        self.cpus = cpus or set()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log_path.open("wb")
        self._process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        if cpus:
            # Before the interpreter has started any thread: every thread it makes inherits this.
            os.sched_setaffinity(self._process.pid, cpus)
        self._log_path = log_path

    def wait_ready(self) -> str:
        """Blocks until /health answers; returns the served model's id."""
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"the server exited ({self._process.returncode}): "
                                   f"{self._log_path.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.25)
        else:
            raise RuntimeError(f"the server did not answer /health in {SERVER_START_TIMEOUT_S} s")
        with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as response:
            return json.load(response)["data"][0]["id"]

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _split_cpus(remote_cpus: int) -> set[int]:
    """The last `remote_cpus` of the CPUs this process may use, for the server."""
    cpus = sorted(os.sched_getaffinity(0))
    if not 0 < remote_cpus < len(cpus):
        raise SystemExit(f"--remote-cpus must be between 1 and {len(cpus) - 1} on this machine")
    return set(cpus[-remote_cpus:])


def _engine_with_threads(num_threads: int | None):
    """The host's engine factory with the local engine's thread count set."""
    from pagoda.app.backends.services.local_engine import make_local_engine

    def make(model, config, on_progress):
        return make_local_engine(model, dataclasses.replace(config, num_threads=num_threads),
                            on_progress)

    return make


async def _open_tab(window, settings, prompt: str):
    conversation = await window.db.create_conversation(sampling=settings)
    tab = await window.chat_tabs.open_conversation(conversation.id)
    tab.composer.set_text(prompt)
    return tab


async def _save_server(window, url: str, model: str):
    """Saves the server, as "Add a server…" would have in an earlier session."""
    return await window.sources.saved.add(f"{url}/v1", model, None)


async def _answer_from_server(window, connection):
    """Switches the current tab to the saved server, as the model picker would."""
    window.remote_servers.use_source_in_current_chat(connection.id)
    if window.chat_tabs.current_controller().session.source is not window.sources.source(connection.id):
        raise RuntimeError("the tab did not switch to the server")


@dataclasses.dataclass(slots=True)
class ToolCallTimes:
    """One call the bench ran by clicking Run: `run_at` and `result_at` on the meter's clock
    (perf_counter), `run_monotonic` on the clock the MCP server's `clock` tool reports
    (CLOCK_MONOTONIC, one for every process of a Linux machine)."""

    tab: int
    name: str
    run_at: float
    run_monotonic: float
    result_at: float = 0.0
    result: str = ""

    def run_to_server_ms(self) -> float | None:
        """For `clock`: from just before the click to the server's clock as the call arrived."""
        return (float(self.result) - self.run_monotonic) * 1000 if self.name == "clock" else None

    def as_dict(self) -> dict:
        """Its figures; the result is seen by polling, every POLL_S."""
        reach = self.run_to_server_ms()
        return {"tab": self.tab, "name": self.name,
                "run_to_server_ms": None if reach is None else round(reach, 2),
                "run_to_result_seen_ms": round((self.result_at - self.run_at) * 1000, 1)}


class ToolTab:
    """A tab answered by the scripted thinking, tool-calling model. Answers each call that asks
    as the user does: the tab made current, a moment to find the card, then a mouse click on
    the call's Run link in the transcript (one tab at a time: `hand` is the user's one mouse)."""

    def __init__(self, window, tab, index: int, hand: asyncio.Lock) -> None:
        self.window, self.tab, self.index, self.hand = window, tab, index, hand
        self.controller = window.controllers[tab.conversation_id]
        self.sent = 0.0
        self.first_asked: float | None = None  # its first call asks: the thinking has ended
        self.calls: list[ToolCallTimes] = []

    async def drive(self, sent: float) -> None:
        """Until the turn has ended: Run on each call that asks."""
        self.sent = sent
        while not _reply_ended(self.controller):
            asking = _asking_call(self.controller.session.views)
            if asking is None:
                await asyncio.sleep(POLL_S)
                continue
            if self.first_asked is None:
                self.first_asked = time.perf_counter()
            async with self.hand:
                times = await self._click_run(*asking)
            await self._wait_for_result(times, asking[2].id)
            self.calls.append(times)

    async def _click_run(self, message_id: int, index: int, call) -> ToolCallTimes:
        from PySide6.QtCore import Qt
        from PySide6.QtTest import QTest

        self.window.tabs.setCurrentWidget(self.tab)
        await asyncio.sleep(LOOK_S)
        browser, point = _run_link(self.tab.transcript, message_id, index)
        times = ToolCallTimes(self.index, call.name, time.perf_counter(), time.monotonic())
        QTest.mouseClick(browser.viewport(), Qt.MouseButton.LeftButton, pos=point)
        return times

    async def _wait_for_result(self, times: ToolCallTimes, call_id: str) -> None:
        while True:
            result = next((m for m in self.controller.path
                           if m.role == "tool" and m.tool_call_id == call_id), None)
            if result is not None:
                times.result_at, times.result = time.perf_counter(), result.content
                return
            waited = time.perf_counter() - times.run_at
            asking = _asking_call(self.controller.session.views)
            if waited > CLICK_TIMEOUT_S and asking is not None and asking[2].id == call_id:
                raise RuntimeError(f"tab {self.index}: the click on Run did not answer the call")
            if waited > CALL_TIMEOUT_S:
                raise RuntimeError(f"tab {self.index}: no result of {times.name} in "
                                   f"{CALL_TIMEOUT_S} s: {self.controller.view.notice_text()}")
            await asyncio.sleep(POLL_S)


def _asking_call(views) -> tuple[int, int, object] | None:
    """(message id, index, call view) of a call waiting for the user's answer, if any."""
    for view in reversed(views):
        for index, call in enumerate(view.tool_calls):
            if call.state == "asking":
                return view.id, index, call
    return None


def _run_link(transcript, message_id: int, index: int):
    """The transcript's text browser and the middle of the call's Run link, scrolled into view
    (in the viewport's coordinates, where a mouse click lands)."""
    from PySide6.QtGui import QTextCursor
    from PySide6.QtWidgets import QTextBrowser

    browser = transcript.findChild(QTextBrowser, "transcriptText")
    document = browser.document()
    href_end = f"/call-run/{message_id}/{index}"
    block = document.begin()
    while block.isValid():
        fragments = block.begin()
        while not fragments.atEnd():
            fragment = fragments.fragment()
            if fragment.charFormat().anchorHref().endswith(href_end):
                cursor = QTextCursor(document)
                cursor.setPosition(fragment.position() + fragment.length() // 2)
                return browser, _scrolled_into_view(browser, cursor)
            fragments += 1
        block = block.next()
    raise RuntimeError(f"no Run link for call {index} of message {message_id} in the transcript")


def _scrolled_into_view(browser, cursor):
    rect = browser.cursorRect(cursor)
    if not browser.viewport().rect().contains(rect.center()):
        bar = browser.verticalScrollBar()
        bar.setValue(bar.value() + rect.center().y() - browser.viewport().height() // 2)
        rect = browser.cursorRect(cursor)
    return rect.center()


async def _start_mcp_server(window) -> None:
    """The MCP test server saved in Settings -> Tools and started, as after a first use."""
    from pagoda.app.components.tools import McpServerConfig

    window.toolbox.settings.add_servers(
        [McpServerConfig(MCP_SERVER, command=sys.executable, args=(str(MCP_TEST_SERVER),))])
    await window.toolbox.list_tools(MCP_SERVER)


async def _open_tool_tab(window, connection, index: int, hand: asyncio.Lock) -> ToolTab:
    """A tab on the scripted model with the MCP server's tools turned on, as the chat's
    settings panel saves them."""
    from pagoda.app.store import SamplingSettings

    settings = SamplingSettings(temperature=0.7, max_tokens=TOOL_MAX_TOKENS, seed=1)
    tab = await _open_tab(window, settings, TOOL_PROMPT)
    await _answer_from_server(window, connection)
    session = window.controllers[tab.conversation_id].session
    await session.save_settings(dataclasses.replace(session.settings, tools=(MCP_SERVER,)))
    return ToolTab(window, tab, index, hand)


def _gap_stats(gaps: list[float]) -> dict:
    gaps = sorted(gaps)
    if not gaps:
        return {"ticks": 0}
    return {"ticks": len(gaps), "max_stall_ms": round(gaps[-1], 1),
            "p99_stall_ms": round(gaps[max(0, int(len(gaps) * 0.99) - 1)], 1)}


def _gaps_during(meter: StallMeter, spans: list[tuple[float, float]]) -> list[float]:
    """The gaps that overlap any of `spans` (perf_counter times)."""
    return [gap for end, gap in zip(meter.tick_times, meter.gaps_ms, strict=True)
            if any(end - gap / 1000 < until and end > since for since, until in spans)]


def _tool_figures(meter: StallMeter, tool_tabs: list[ToolTab]) -> dict:
    """Run to server per `clock` call, and the stalls while the tool tabs think (from the send
    until the tab's first call asks: the model streams its thinking for all but the first
    tens of ms) and while their `hang` calls run (from the click on Run to the result seen)."""
    calls = [c for t in tool_tabs for c in t.calls]
    reach = [c.run_to_server_ms() for c in calls if c.name == "clock"]
    thinking = [(t.sent, t.first_asked) for t in tool_tabs if t.first_asked is not None]
    hanging = [(c.run_at, c.result_at) for c in calls if c.name == "hang"]
    return {
        "tool_tabs": len(tool_tabs),
        "run_clicked_by": "a mouse click (QTest) on the call's Run link in the transcript",
        "tool_calls": [c.as_dict() for c in calls],
        "run_to_server_ms": {"calls": len(reach),
                             "median": round(statistics.median(reach), 2) if reach else None,
                             "max": round(max(reach), 2) if reach else None},
        "thinking": {"seconds": [round(b - a, 2) for a, b in thinking],
                     **_gap_stats(_gaps_during(meter, thinking))},
        "hang": {"seconds": [round(b - a, 2) for a, b in hanging],
                 **_gap_stats(_gaps_during(meter, hanging))},
    }


async def measure(window, tabs: int, remote_tabs: int, max_tokens: int,
                  server: ServerProcess | None, trace_stalls_ms: float | None,
                  tool_tabs: int = 0, tool_server: ServerProcess | None = None) -> dict:
    from pagoda.app.store import SamplingSettings

    model = await asyncio.to_thread(server.wait_ready) if server else None
    connection = await _save_server(window, server.url, model) if server else None
    scripted = None
    if tool_server:
        scripted_model = await asyncio.to_thread(tool_server.wait_ready)
        scripted = await _save_server(window, tool_server.url, scripted_model)
    await window.restore()  # as the app starts: with the servers among the saved ones
    while not window.host.is_ready:
        await asyncio.sleep(0.05)
    settings = SamplingSettings(temperature=0.7, max_tokens=max_tokens, seed=1)
    local = [await _open_tab(window, settings, PROMPTS[i % len(PROMPTS)]) for i in range(tabs)]
    remote = []
    for i in range(tabs, tabs + remote_tabs):
        remote.append(await _open_tab(window, settings, PROMPTS[i % len(PROMPTS)]))
        await _answer_from_server(window, connection)
    hand = asyncio.Lock()
    if tool_tabs:
        await _start_mcp_server(window)
    tooled = [await _open_tool_tab(window, scripted, i, hand) for i in range(tool_tabs)]
    opened = local + remote + [t.tab for t in tooled]
    load_before = os.getloadavg()
    meter = StallMeter()
    tracer = StallTracer(meter, trace_stalls_ms) if trace_stalls_ms else None
    meter.start()
    if tracer:
        tracer.start()
    start = time.perf_counter()
    for tab in opened:
        tab.composer.send_requested.emit(tab.composer.text())
        tab.composer.set_text("")
    drivers = asyncio.gather(*(t.drive(start) for t in tooled))
    controllers = [window.controllers[t.conversation_id] for t in opened]
    await asyncio.sleep(0.5)
    while not all(map(_reply_ended, controllers)):
        if drivers.done():
            drivers.result()  # a tool tab's failure, raised here
        if time.perf_counter() - start > REPLIES_TIMEOUT_S:
            notices = [c.view.notice_text() for c in controllers]
            raise RuntimeError(f"the replies did not end in {REPLIES_TIMEOUT_S} s: {notices}")
        await asyncio.sleep(0.05)
    await drivers
    elapsed = time.perf_counter() - start
    meter.stop()
    if tracer:
        tracer.stop()
    replies = [c.path[-1] for c in controllers]
    local_tokens = sum(r.completion_tokens or 0 for r in replies[:tabs])
    remote_tokens = sum(r.completion_tokens or 0 for r in replies[tabs:tabs + remote_tabs])
    tokens = local_tokens + remote_tokens
    gaps = sorted(meter.gaps_ms)
    return {"tabs": tabs, "remote_tabs": remote_tabs, "max_tokens": max_tokens,
            "seconds": round(elapsed, 2), "output_tokens": tokens,
            "local_output_tokens": local_tokens, "remote_output_tokens": remote_tokens,
            "tokens_per_s": round(tokens / elapsed, 1),
            "reply_statuses": [r.status for r in replies],
            "ticks": len(gaps), "max_stall_ms": round(gaps[-1], 1),
            "p99_stall_ms": round(gaps[int(len(gaps) * 0.99) - 1], 1),
            "median_tick_ms": round(statistics.median(gaps), 1),
            "stalls_over_50ms": sum(g > 50 for g in gaps),
            "stalls_over_50ms_at_s_and_ms": meter.long_gaps,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            **(_tool_figures(meter, tooled) if tooled else {}),
            **({"stalls": tracer.report(), "full_collections": tracer.collections}
               if tracer else {})}


def _reply_ended(controller) -> bool:
    """The reply is stored as ended and the tab has read it back (is_streaming turns False
    before the tab reloads the ended reply, and is False before the reply begins)."""
    path = controller.path
    return (not controller.is_streaming and bool(path) and path[-1].role == "assistant"
            and path[-1].status != "streaming")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tabs", type=int, default=3, help="tabs answered by the local engine")
    parser.add_argument("--remote-tabs", type=int, default=0,
                        help="tabs answered by a Pagoda server in another process (default 0)")
    parser.add_argument("--tool-tabs", type=int, default=0,
                        help="tabs answered by a scripted thinking, tool-calling model whose "
                             "calls go to the tests' MCP server (default 0)")
    parser.add_argument("--max-tokens", type=int, default=128)
    half = max(1, len(os.sched_getaffinity(0)) // 2)
    parser.add_argument("--local-threads", type=int, default=None,
                        help=f"the local engine's threads (default: all CPUs; {half} with "
                             "remote tabs)")
    parser.add_argument("--remote-cpus", type=int, default=half,
                        help=f"CPUs the server is pinned to, one thread each (default {half})")
    parser.add_argument("--trace-stalls", type=float, metavar="MS",
                        help="sample the GUI thread's stack during gaps over MS and report them")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    local_threads = args.local_threads or (half if args.remote_tabs else None)

    import qasync
    from PySide6.QtWidgets import QApplication

    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.components.shared.connections import ConnectionKeys
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.store import ConversationStore

    app = QApplication(sys.argv[:1])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with tempfile.TemporaryDirectory() as tmp:
        remote_cpus = _split_cpus(args.remote_cpus) if args.remote_tabs else None
        server = tool_server = None
        try:
            if args.remote_tabs:
                server = ServerProcess([sys.executable, "-m", "pagoda.engine", "serve"],
                                       Path(tmp) / "server.log", remote_cpus)
            if args.tool_tabs:
                tool_server = ServerProcess([sys.executable, str(SCRIPTED_MODEL)],
                                            Path(tmp) / "scripted_model.log")
            window = MainWindow(AsyncStore(ConversationStore.open(Path(tmp) / "bench.db")),
                                EngineHost(factory=_engine_with_threads(local_threads)),
                                connection_keys=ConnectionKeys.in_memory())
            window.show()
            window.host.load(None)
            with loop:
                result = loop.run_until_complete(
                    measure(window, args.tabs, args.remote_tabs, args.max_tokens, server,
                            args.trace_stalls, args.tool_tabs, tool_server))
                window.close()
                window.db.close()
        finally:
            for process in (server, tool_server):
                if process:
                    process.stop()
    result["local_threads"] = local_threads or "all"
    result["remote_cpus"] = sorted(server.cpus) if server else []
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
