"""gpt-oss's thinking shows as thinking: a real gpt-oss model in this process (the tiny one of
tests/engine/scripted_gpt_oss.py, whose greedy reply is its analysis then its final answer in
harmony's frames) opened in the window, its analysis channel streamed into the reply's
thinking block and its final channel into the message, both still there when the app opens
again on the same chats."""

import pytest

from tests.app.qt.greedy_chat import WAIT_MS, close_window, greedy_turn, real_window
from tests.engine.scripted_gpt_oss import ANALYSIS, FINAL, save_scripted_gpt_oss

pytestmark = pytest.mark.slow  # a real engine loads: ~5 s on a busy 2-core machine


@pytest.fixture(scope="module")
def gpt_oss_folder(tmp_path_factory):
    return save_scripted_gpt_oss(tmp_path_factory.mktemp("scripted-gpt-oss"))


def test_gpt_oss_analysis_shows_as_thinking_and_its_final_answer_as_the_reply_after_a_restart(
        gpt_oss_folder, qloop, qtbot, run_async, tmp_path):
    window = real_window(qtbot, tmp_path / "chats.db")
    try:
        window.models_controller.open_model_file(str(gpt_oss_folder / "config.json"))
        qtbot.waitUntil(lambda: window.host.is_ready, timeout=WAIT_MS)
        _, reply, shown = greedy_turn(window, qtbot, run_async, "What is 2 + 3?", 32)
        assert (reply.status, reply.finish_reason) == ("complete", "stop"), reply.error
        assert (reply.reasoning, reply.content) == (ANALYSIS, FINAL)
        kinds = [kind for kind, _ in shown]
        assert kinds == sorted(kinds, reverse=True)  # the thinking streamed first, live
        assert "".join(d for kind, d in shown if kind == "thinking") == ANALYSIS
        assert "".join(d for kind, d in shown if kind == "answer") == FINAL
        reply_id, conversation_id = reply.id, reply.conversation_id
    finally:
        close_window(window)

    again = real_window(qtbot, tmp_path / "chats.db")
    try:
        run_async(again.restore())
        transcript = again.controllers[conversation_id].view.transcript
        assert transcript.reasoning_text(reply_id) == ANALYSIS
        assert transcript.message_text(reply_id) == FINAL
        shown_text = transcript.plain_text()
        assert "▸ Thought" in shown_text and FINAL in shown_text
        assert ANALYSIS not in shown_text  # folded under its thinking line
        assert "<|" not in shown_text  # no frame token reaches the page
    finally:
        close_window(again)
