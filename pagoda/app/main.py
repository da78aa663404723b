"""`pagoda`: open the window at once, load the model behind it, bring every chat back."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pagoda import __version__

if TYPE_CHECKING:
    from pagoda.app.store import ConversationStore

logger = logging.getLogger("pagoda")
STARTED = time.perf_counter()  # as this module is imported: `pagoda` has just started

EXIT_NO_DATABASE = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="pagoda", description="Chat with local language models.",
        epilog="pagoda serve [--model M] [--port N] …: the model over OpenAI's API, without the "
               "window (see pagoda serve --help)")
    parser.add_argument("--model", help="a Hugging Face model folder or a .gguf file "
                                        "(default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--db", type=Path, help="the conversation database "
                                                "(default: $PAGODA_DB, else the user data folder)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--theme", choices=["system", "light", "dark"],
                        help="for this run only (default: as chosen in Settings, else the "
                             "system's)")
    parser.add_argument("--version", action="version", version=f"Pagoda {__version__}")
    parser.add_argument("--selftest", action="store_true",
                        help="check this installation: answer one question offscreen on a "
                             "temporary database, print what happened, exit 0 if it worked")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("pagoda").setLevel(logging.INFO)
    if args.selftest:
        from pagoda.app.selftest import run_selftest

        return run_selftest(args)
    # Imported here so that --help and --version answer without loading Qt and torch.
    from pagoda.app.bootstrap import build_window, create_app, install_event_loop, run_until_done
    from pagoda.app.qt.single_instance import WindowRaiser, bring_to_front

    app = create_app(args.theme or "system")
    if _raised_the_running_window(args.db):
        return 0
    store = open_store_or_say_why(args.db)
    if store is None:
        return EXIT_NO_DATABASE
    # Listening from the moment the database is ours: a start meanwhile is answered once the
    # loop runs, and the window it asks for is about to show anyway.
    raiser = WindowRaiser(store.path)
    raiser.listen()
    loop = install_event_loop(app)
    window = build_window(store, args.device)
    raiser.raise_requested.connect(lambda: bring_to_front(window))
    window.closed.connect(raiser.close)  # a closing window is not brought back
    # Ctrl+C in a terminal or a logout's SIGTERM: close like the window's close button, which
    # keeps every partial reply.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: window.close())
    run_until_done(loop, _run(window, args))
    return 0


def serve(argv: list[str]) -> int:
    """`pagoda serve …`: the engine's `serve` command (an installed Pagoda has no `python -m
    engine`); no window, no Qt."""
    from pagoda.engine.cli.main import main as engine_main

    return engine_main(["serve", *argv])


def _raised_the_running_window(path: Path | None) -> bool:
    """True (said on stderr) when a Pagoda that has this database open brought its window to
    the front; then this start touches nothing. One that does not answer is refused by the
    store's lock, in words, when this start opens the database."""
    from pagoda.app.qt.single_instance import ask_running_window_to_raise
    from pagoda.app.store import resolve_db_path

    database = resolve_db_path(path)
    if not ask_running_window_to_raise(database):
        return False
    print(f"pagoda: Pagoda is already open on {database}; its window was brought to the front.",
          file=sys.stderr)
    return True


def open_store_or_say_why(path: Path | None) -> ConversationStore | None:
    """The store, at `path` or at a file the user chooses instead; None when they quit (said on
    stderr). Modal dialogs: call it before the event loop runs."""
    from pagoda.app.open_store import open_store
    from pagoda.app.qt.conversations.database_dialog import ask_for_another_database
    from pagoda.app.store.errors import StoreError

    try:
        return open_store(path, ask_for_another_database)
    except StoreError as error:
        print(f"pagoda: no conversation database, quitting. {error}", file=sys.stderr)
        return None


async def _run(window, args: argparse.Namespace) -> None:
    closed = asyncio.Event()
    window.destroyed.connect(closed.set)
    window.closed.connect(closed.set)
    window.show()
    logger.info("window shown %.2f s after start", time.perf_counter() - STARTED)
    log_first_model_ready(window.host)
    if window.recovered_from is not None:
        window.notify_recovered(window.recovered_from)
    await window.settings_dock.restore_appearance(args.theme)
    await window.models_controller.restore_model_settings()
    model = args.model or await _last_model(window)
    window.host.load(model)
    await window.server_controller.restore()
    await window.restore()
    await closed.wait()
    window.db.close()


def log_first_model_ready(host) -> None:
    """Log how long after the app's start its first model was ready; later loads (a switch)
    log their own time from when they began (EngineHost)."""

    def ready(name: str) -> None:
        host.model_loaded.disconnect(ready)
        logger.info("model %s ready %.2f s after start", name, time.perf_counter() - STARTED)

    host.model_loaded.connect(ready)


async def _last_model(window) -> str | None:
    """The model the user last chose, if it is still there; else the bundled one."""
    from pagoda.app.qt.models.models_controller import LAST_MODEL_SETTING

    path = await window.db.get_setting(LAST_MODEL_SETTING)
    return path if path and Path(path).exists() else None


if __name__ == "__main__":
    sys.exit(main())
