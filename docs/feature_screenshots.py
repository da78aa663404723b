"""Take docs/documents.png and docs/tools.png from the real window.

documents.png: the bundled model (SmolLM2-135M, in this process) answering a question about an
attached file: the file on the user's message, the reply's sources under it.

tools.png: a chat answered by a thinking, tool-calling model. The bundled model neither thinks
nor calls tools reliably, so that reply comes from a small scripted OpenAI-compatible server
started here (it streams reasoning, then a call of `add`, then an answer with math); the
thinking block, the call with Run / Always / Deny, the MCP server (the tests' real one, over
stdio), its folded result and the rendered math are the window's own.

Run under a real X server: `xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python
docs/feature_screenshots.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs"))
os.environ.setdefault("QT_QPA_PLATFORM", "xcb")

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from PySide6.QtCore import Qt, QUrl
from screenshot import start_app

MODEL = "scripted-thinker"
THOUGHT = ("The user wants the sum of the two readings. I should not add them in my head: the "
           "calculator tool is there for that. I'll call add with 1234 and 5678.")
ANSWER = ("The two readings add up to **6,912** litres. For the whole season that is "
          "$\\bar{x} = \\frac{6912}{90} \\approx 76.8$ litres a day.")
LOG = """# Lighthouse log, autumn

## Oil
The lamp burned 1,234 litres of oil in September and 5,678 litres from October to the end of
November, when the winter wick was fitted.

## Repairs
The lens was cleaned every Tuesday. The brass was polished on Fridays. A cracked pane on the
gallery was replaced on 12 October.
"""


def scripted_model():
    """A FastAPI app streaming, per turn: thinking and a call of add; then the answer."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 8192}]})

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        answered = body["messages"][-1]["role"] == "tool"
        return StreamingResponse(_events(answered), media_type="text/event-stream")

    async def _events(answered: bool):
        def chunk(delta: dict, finish: str | None = None) -> str:
            return "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk",
                                          "model": MODEL, "choices": [
                                              {"index": 0, "delta": delta,
                                               "finish_reason": finish}]}) + "\n\n"
        if answered:
            for word in ANSWER.split(" "):
                await asyncio.sleep(0.02)
                yield chunk({"content": word + " "})
            yield chunk({}, "stop")
        else:
            for word in THOUGHT.split(" "):
                await asyncio.sleep(0.12)
                yield chunk({"reasoning_content": word + " "})
            yield chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "add",
                                                      "arguments": '{"a": 1234, "b": 5678}'}}]})
            yield chunk({}, "tool_calls")
        yield "data: [DONE]\n\n"

    return app


def serve(app) -> str:
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}/v1"


async def until(condition, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not get there in time")
        await asyncio.sleep(0.1)


async def documents_chat(window, folder: Path) -> None:
    from pagoda.app.store import SamplingSettings

    while not window.host.is_ready:
        await asyncio.sleep(0.1)
    log = folder / "lighthouse-log.md"
    log.write_text(LOG, encoding="utf-8")
    chat = await window.db.create_conversation(
        title="Lighthouse log", sampling=SamplingSettings(temperature=0.0, max_tokens=60))
    tab = await window.chat_tabs.open_conversation(chat.id)
    session = window.controllers[chat.id].session
    await session.files.attach([str(log)])
    tab.composer.send_requested.emit("According to the log, how many litres of oil did the lamp burn in "
                                     "September?")
    await asyncio.sleep(0.5)
    await until(lambda: not session.is_streaming)


async def tools_chat(window, url: str) -> None:
    from pagoda.app.components.tools import McpServerConfig
    from pagoda.app.store import SamplingSettings

    test_server = ROOT / "tests" / "app" / "components" / "tools" / "mcp_test_server.py"
    connection = await window.sources.saved.add(url, MODEL, None)
    chat = await window.db.create_conversation(
        title="Oil totals", sampling=SamplingSettings(max_tokens=400))
    tab = await window.chat_tabs.open_conversation(chat.id)
    window.remote_servers.use_source_in_current_chat(connection.id)
    session = window.controllers[chat.id].session
    window.toolbox.settings.add_servers(
        [McpServerConfig("calculator", command=sys.executable, args=(str(test_server),))])
    tree = window.settings_panel.tools_tree  # the chat turns the server on, as a click does
    tree.topLevelItem(0).setCheckState(0, Qt.CheckState.Checked)
    await until(lambda: session.conversation.sampling.tools == ("calculator",))
    tab.composer.send_requested.emit("Add September's and the autumn's oil: 1234 and 5678 "
                                     "litres. What is that a day over 90 days?")

    def asking() -> bool:
        return any(c.state == "asking" for v in session.views for c in v.tool_calls)

    try:
        await until(asking, 60)
    except TimeoutError:
        print("notice:", session.notice, [(v.role, v.content[:60], v.tool_calls) for v in
                                          session.views], file=sys.stderr)
        raise
    call = next(c for v in session.views for c in v.tool_calls if c.state == "asking")
    session.answer_tool_call(call.id, "run")
    await asyncio.sleep(0.5)
    await until(lambda: not session.is_streaming)
    thought = session.views[1].id  # its thinking opened, as a click on "Thought for…" does
    tab.transcript._browser.anchorClicked.emit(
        QUrl(tab.transcript._href("reasoning", thought)))
    await asyncio.sleep(0.5)


def main() -> int:
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.components.shared.connections import ConnectionKeys
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.store import ConversationStore

    _app, loop = start_app()
    url = serve(scripted_model())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["PAGODA_KV_CACHE_DIR"] = str(folder / "kv-blocks")
        host = EngineHost()
        window = MainWindow(AsyncStore(ConversationStore.open(folder / "shot.db")), host,
                            connection_keys=ConnectionKeys.in_memory())
        window.resize(1360, 840)
        window.move(0, 0)
        window.show()
        host.load(None)
        with loop:
            loop.run_until_complete(window.restore())
            window.chat_tabs.close_tab(0)
            loop.run_until_complete(documents_chat(window, folder))
            window.grab().save(str(ROOT / "docs" / "documents.png"))
            loop.run_until_complete(tools_chat(window, url))
            window.grab().save(str(ROOT / "docs" / "tools.png"))
            window.close()
            window.db.close()
    print("saved docs/documents.png and docs/tools.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
