"""`pagoda --selftest`: prove an installation works, end to end, without a screen or a network.

It builds the real window offscreen on a temporary database, loads the model (by default the
bundled one), sends one question through a tab's controller, waits for the streamed reply, and checks
that it is complete and saved. It prints what it did; the exit status is 0 on success, 1 on any
failure (one line on stderr says which step failed; PAGODA_SELFTEST_TRACEBACK=1 adds the
traceback), 2 if it ran past its time limit (PAGODA_SELFTEST_TIMEOUT seconds, default 300).

The GGUF file's config and tokenizer are cached in a temporary folder, so every run builds them
afresh: that is the path a new user's first start takes, and the one most likely to break in a
frozen bundle (it needs transformers' GGUF support and gguf). Set PAGODA_CACHE_DIR to reuse a cache.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from pagoda import __version__

QUESTION = "What is the capital of France?"
TIMEOUT_S = 300.0
# The event loop checks its own deadline; this one ends the process if the loop itself is stuck.
WATCHDOG_GRACE_S = 30.0
EXIT_FAILED = 1
TRACEBACK_ENV = "PAGODA_SELFTEST_TRACEBACK"
EXIT_TIMED_OUT = 2


class SelftestError(Exception):
    """A step of the self-test failed; the message names it."""


@dataclass(slots=True)
class SelftestReport:
    model: str = ""
    model_source: str = ""
    load_s: float = 0.0
    reply: str = ""
    completion_tokens: int = 0
    tokens_per_s: float | None = None
    ttft_s: float | None = None
    stored_roles: tuple[str, ...] = ()


def run_selftest(args: argparse.Namespace) -> int:
    """Run the self-test in this process; returns the exit status."""
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    timeout_s = float(os.environ.get("PAGODA_SELFTEST_TIMEOUT", TIMEOUT_S))
    _start_watchdog(timeout_s + WATCHDOG_GRACE_S)
    print(f"Pagoda {__version__} self-test", flush=True)
    with tempfile.TemporaryDirectory(prefix="pagoda-selftest-") as scratch:
        scratch_dir = Path(scratch)
        if not os.environ.get("PAGODA_CACHE_DIR"):
            os.environ["PAGODA_CACHE_DIR"] = str(scratch_dir / "cache")
            cache_note = "temporary: the tokenizer is built afresh"
        else:
            cache_note = "PAGODA_CACHE_DIR: an earlier tokenizer cache is reused"
        db_path = scratch_dir / "selftest.db"
        _line("database", f"{db_path} (temporary)")
        _line("cache", f"{os.environ['PAGODA_CACHE_DIR']} ({cache_note})")
        try:
            report = _run_in_window(db_path, args, timeout_s)
        except TimeoutError:
            print(f"pagoda --selftest: timed out after {timeout_s:.0f} s", file=sys.stderr)
            return EXIT_TIMED_OUT
        except Exception as error:  # noqa: BLE001 - any failure is the answer, on one line
            if os.environ.get(TRACEBACK_ENV) == "1":
                traceback.print_exc()
            print(f"pagoda --selftest: FAILED: {type(error).__name__}: {error} "
                  f"(set {TRACEBACK_ENV}=1 for the traceback)", file=sys.stderr)
            return EXIT_FAILED
    _print_report(report)
    print("selftest passed", flush=True)
    return 0


def _run_in_window(db_path: Path, args: argparse.Namespace, timeout_s: float) -> SelftestReport:
    # Imported here, inside run_selftest's try: a bundle missing a module fails on one line.
    from pagoda.app.bootstrap import build_window, create_app, install_event_loop, run_until_done
    from pagoda.app.store import ConversationStore

    loop = install_event_loop(create_app(args.theme or "system"))
    window = build_window(ConversationStore.open(db_path), args.device, remember_layout=False)
    try:
        return run_until_done(loop, _exercise_then_close(window, args.model, timeout_s))
    finally:
        window.db.close()


async def _exercise_then_close(window, model: str | None, timeout_s: float) -> SelftestReport:
    try:
        return await asyncio.wait_for(_exercise(window, model), timeout_s)
    finally:
        window.close()  # as a user would: the reply is kept, the engine stops


async def _exercise(window, model: str | None) -> SelftestReport:
    from pagoda.app.store import SamplingSettings
    from pagoda.engine.loading.loader import default_model_file

    report = SelftestReport(model_source=model or str(default_model_file()))
    _line("model", report.model_source)
    window.show()
    started = time.monotonic()
    await window.host.load(model)
    if not window.host.is_ready:
        raise SelftestError(f"the model did not load: {window.host.status.detail}")
    report.load_s = time.monotonic() - started
    report.model = window.host.model_name
    _line("loaded", f"{report.model} in {report.load_s:.1f} s")
    _line("kernels", _kernels_line())
    _line("math", _math_line())
    _line("documents", _documents_line())

    greedy = SamplingSettings(temperature=0.0, max_tokens=32, repetition_penalty=1.0)
    conversation = await window.db.create_conversation(title="Self-test", sampling=greedy)
    tab = await window.chat_tabs.open_conversation(conversation.id)
    controller = window.controllers[conversation.id]
    _line("asked", QUESTION)
    tab.composer.send_requested.emit(QUESTION)
    reply = await _reply_when_done(controller)
    if reply.status != "complete":
        raise SelftestError(f"the reply ended {reply.status!r}: {reply.error or 'no error given'}")
    if not reply.content.strip():
        raise SelftestError("the model streamed an empty reply")
    report.reply = reply.content
    report.completion_tokens = reply.completion_tokens or 0
    if reply.stats is not None:
        report.tokens_per_s, report.ttft_s = reply.stats.tokens_per_s, reply.stats.ttft_s

    stored = await window.db.current_path(conversation.id)
    report.stored_roles = tuple(m.role for m in stored)
    if report.stored_roles != ("user", "assistant") or stored[-1].content != reply.content:
        raise SelftestError(f"the store holds {report.stored_roles}, not the question and reply")
    return report


def _math_line() -> str:
    """A formula drawn as the transcript draws one: the math fonts are where ziamath reads them."""
    from pagoda.app.qt.chat.markdown.math_render import MathLook, render_math

    drawn = render_math(r"e^{i\pi} + 1 = 0", MathLook("#000000", 16, display=False))
    if drawn is None or drawn.image.isNull():
        raise SelftestError("a formula could not be drawn: the math fonts are missing")
    return f"a formula drawn at {drawn.width:.0f} x {drawn.height:.0f} px"


def _documents_line() -> str:
    """A page read as an attachment is read: markitdown and its converters are in the bundle."""
    from pagoda.app.components.documents import chunk_document, read_document

    with tempfile.TemporaryDirectory(prefix="pagoda-selftest-doc-") as folder:
        page = Path(folder) / "page.html"
        page.write_text("<html><body><h1>Lighthouses</h1><p>The lamp is lit at dusk.</p>"
                        "</body></html>", encoding="utf-8")
        document = read_document(page)
    if "lit at dusk" not in document.text:
        raise SelftestError(f"an HTML page was read as {document.text[:80]!r}")
    return f"an HTML page read into {len(chunk_document(document))} passage(s)"


def _kernels_line() -> str:
    """Our C kernels and where each came from: an installer should carry them prebuilt."""
    from pagoda.engine.quantization.native_kernels import kernel_report

    report = kernel_report()
    return ", ".join(f"{name} {where}" for name, where in report.items()) or "none"


async def _reply_when_done(controller, poll_s: float = 0.05):
    """The assistant message once the controller has stopped streaming it."""
    while True:
        await asyncio.sleep(poll_s)
        path = controller.path
        if controller.is_streaming or len(path) < 2 or path[-2].content != QUESTION:
            continue
        if path[-1].role == "assistant" and path[-1].status != "streaming":
            return path[-1]


def _print_report(report: SelftestReport) -> None:
    speed = f", {report.tokens_per_s:.1f} tok/s" if report.tokens_per_s else ""
    first = f", first token after {report.ttft_s:.2f} s" if report.ttft_s is not None else ""
    _line("reply", report.reply.strip())
    _line("tokens", f"{report.completion_tokens}{speed}{first}")
    _line("stored", " + ".join(report.stored_roles))


def _line(label: str, text: str) -> None:
    print(f"  {label:<9} {text}", flush=True)


def _start_watchdog(after_s: float) -> None:
    def expire() -> None:
        print(f"pagoda --selftest: stuck for {after_s:.0f} s; giving up", file=sys.stderr,
              flush=True)
        os._exit(EXIT_TIMED_OUT)

    timer = threading.Timer(after_s, expire)
    timer.daemon = True
    timer.start()
