"""The window's local server and its tabs share one engine: an API client and a tab generate in
the same batch. On the real default model."""

import json
import threading

import httpx
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPlainTextEdit

from pagoda.app.store import SamplingSettings

pytestmark = pytest.mark.slow

WAIT_MS = 120_000
API_TOKENS = 48


def _stream_chat(address: str, result: dict) -> None:
    """A streamed chat completion that writes API_TOKENS tokens whatever the model says."""
    body = {"messages": [{"role": "user", "content": "Count from one to twenty."}],
            "max_tokens": API_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{address}/v1/chat/completions", json=body,
                      timeout=WAIT_MS / 1000) as response:
        result["status"] = response.status_code
        result["events"] = [line.removeprefix("data: ") for line in response.iter_lines()
                            if line.startswith("data: ")]


def _text(events: list[str]) -> str:
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_the_windows_server_and_a_tab_stream_at_the_same_time_from_one_engine(
        make_window, qtbot, run_async):
    window = make_window()
    window.local_server.port = 0  # any free port
    run_async(window.server_controller.set_enabled(True))
    assert window.local_server.is_running, window.local_server.error
    engine = window.host.backend.engine
    assert window.local_server.served().backend is engine
    conversation = window.db.store.create_conversation(
        sampling=SamplingSettings(temperature=0.0, max_tokens=24, repetition_penalty=1.0))
    tab = run_async(window.chat_tabs.open_conversation(conversation.id))
    controller = window.controllers[tab.conversation_id]

    result: dict = {}
    client = threading.Thread(target=_stream_chat, args=(window.local_server.address, result),
                              daemon=True)
    client.start()
    qtbot.waitUntil(lambda: engine.stats().num_running == 1, timeout=WAIT_MS)
    composer = tab.composer.findChild(QPlainTextEdit, "composer")
    qtbot.keyClicks(composer, "What is the capital of France?")
    qtbot.keyClick(composer, Qt.Key.Key_Return)

    running_together, status_texts = [], set()

    def both_done() -> bool:
        running_together.append(engine.stats().num_running)
        status_texts.add(window.status.server_label.text())
        path = controller.path
        return (not client.is_alive() and not controller.is_streaming and len(path) == 2
                and path[-1].status != "streaming")

    qtbot.waitUntil(both_done, timeout=WAIT_MS)
    assert max(running_together) == 2
    assert f"API: {window.local_server.address} · 1 request" in status_texts
    reply = controller.path[-1]
    assert reply.status == "complete" and "Paris" in reply.content
    assert result["status"] == 200 and result["events"][-1] == "[DONE]"
    assert _text(result["events"])
    assert window.local_server.running_requests == 0
