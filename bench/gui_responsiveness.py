"""How long the GUI's event loop stalls while tabs stream at once (target: < 50 ms).

Runs the real window (offscreen unless a display is set) on a temporary database with the default
model. A 5 ms QTimer records the gap between its ticks; a gap far over 5 ms is a stall the user
would feel as a frozen window. Not a test: results go to docs/BENCHMARKS.md.

    .venv/bin/python bench/gui_responsiveness.py [--tabs 3] [--remote-tabs 0] [--max-tokens 128]
                                                 [--local-threads N] [--remote-cpus N]
                                                 [--trace-stalls MS] [--json out.json]

--tabs counts the tabs answered by the engine in this process. --remote-tabs N adds N tabs
answered by a saved server: Pagoda's own OpenAI-compatible server (`python -m engine serve`, the
same default model) started here as a separate process on 127.0.0.1, as a user's second machine
would be, except that it shares this machine's cores. `serve` has no thread option, so the server
is pinned to the last --remote-cpus CPUs and its engine uses one thread per CPU it may run on.
With remote tabs the local engine uses --local-threads (default for both: half the CPUs).
--trace-stalls MS samples every thread's stack while the tick is late by more than MS and
reports them per stall, to find what held the GUI thread (it costs a little; leave it out of
runs whose figures are reported).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
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


class StallMeter:
    """Records the gaps between ticks of a fast timer on the GUI thread."""

    def __init__(self) -> None:
        from PySide6.QtCore import QTimer

        self.gaps_ms: list[float] = []
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
        if gap_ms > 50:
            self.long_gaps.append((round(now - self._began, 3), round(gap_ms, 1)))
        self._last = now


class StallTracer:
    """Samples the GUI thread's stack from a thread of its own while the meter's tick is late by
    more than `threshold_ms`: what the GUI thread ran during each stall, for finding its cause."""

    def __init__(self, meter: StallMeter, threshold_ms: float) -> None:
        self._meter = meter
        self._threshold_s = threshold_ms / 1000
        self._gui_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-tracer", daemon=True)
        self._began = 0.0
        self.stalls: dict[float, collections.Counter] = {}

    def start(self) -> None:
        self._began = time.perf_counter()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

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


class RemoteServer:
    """`python -m engine serve` in a process of its own, pinned to `cpus`; stopped on exit."""

    def __init__(self, cpus: set[int], log_path: Path) -> None:
        self.cpus = cpus
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log_path.open("wb")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "engine", "serve", "--host", "127.0.0.1",
             "--port", str(self.port)],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
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
    from app.backends.local_engine import make_local_engine

    def make(model, config, on_progress):
        return make_local_engine(model, dataclasses.replace(config, num_threads=num_threads),
                            on_progress)

    return make


async def _open_tab(window, settings, prompt: str):
    conversation = await window.db.create_conversation(sampling=settings)
    tab = await window.open_conversation(conversation.id)
    tab.composer.set_text(prompt)
    return tab


async def _save_server(window, url: str, model: str):
    """Saves the server, as "Add a server…" would have in an earlier session."""
    return await window.sources.saved.add(f"{url}/v1", model, None)


async def _answer_from_server(window, connection):
    """Switches the current tab to the saved server, as the model picker would."""
    window.use_source_in_current_chat(connection.id)
    if window.current_controller().session.source is not window.sources.source(connection.id):
        raise RuntimeError("the tab did not switch to the server")


async def measure(window, tabs: int, remote_tabs: int, max_tokens: int,
                  server: RemoteServer | None, trace_stalls_ms: float | None) -> dict:
    from app.store import SamplingSettings

    model = await asyncio.to_thread(server.wait_ready) if server else None
    connection = await _save_server(window, server.url, model) if server else None
    await window.restore()  # as the app starts: with the server among the saved ones
    while not window.host.is_ready:
        await asyncio.sleep(0.05)
    settings = SamplingSettings(temperature=0.7, max_tokens=max_tokens, seed=1)
    local = [await _open_tab(window, settings, PROMPTS[i % len(PROMPTS)]) for i in range(tabs)]
    remote = []
    for i in range(tabs, tabs + remote_tabs):
        remote.append(await _open_tab(window, settings, PROMPTS[i % len(PROMPTS)]))
        await _answer_from_server(window, connection)
    opened = local + remote
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
    controllers = [window.controllers[t.conversation_id] for t in opened]
    await asyncio.sleep(0.5)
    while not all(map(_reply_ended, controllers)):
        if time.perf_counter() - start > REPLIES_TIMEOUT_S:
            notices = [c.view.notice_text() for c in controllers]
            raise RuntimeError(f"the replies did not end in {REPLIES_TIMEOUT_S} s: {notices}")
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - start
    meter.stop()
    if tracer:
        tracer.stop()
    replies = [c.path[-1] for c in controllers]
    local_tokens = sum(r.completion_tokens or 0 for r in replies[:tabs])
    remote_tokens = sum(r.completion_tokens or 0 for r in replies[tabs:])
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
            **({"stalls": tracer.report()} if tracer else {})}


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

    from app.components.async_store import AsyncStore
    from app.components.connections import ConnectionKeys
    from app.qt.engine_host import EngineHost
    from app.qt.main_window import MainWindow
    from app.store import ConversationStore

    app = QApplication(sys.argv[:1])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if args.remote_tabs:
            server = RemoteServer(_split_cpus(args.remote_cpus), Path(tmp) / "server.log")
        try:
            window = MainWindow(AsyncStore(ConversationStore.open(Path(tmp) / "bench.db")),
                                EngineHost(factory=_engine_with_threads(local_threads)),
                                connection_keys=ConnectionKeys.in_memory())
            window.show()
            window.host.load(None)
            with loop:
                result = loop.run_until_complete(
                    measure(window, args.tabs, args.remote_tabs, args.max_tokens, server,
                            args.trace_stalls))
                window.close()
                window.db.close()
        finally:
            if server:
                server.stop()
    result["local_threads"] = local_threads or "all"
    result["remote_cpus"] = sorted(server.cpus) if server else []
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
