"""A mixture of experts in the window: llama.cpp's converter's file of the tiny Qwen3-MoE
(`moe_ggufs`, tests/conftest.py), opened from the picker's "Open model file…" entry, loads
with the window's own loader, its picker entry says its parameters in all and those a token
reads, and a chat's reply streams into the tab: the one the folder it came from gives."""

import pytest
import torch
import transformers
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog
from safetensors.torch import load_file

from pagoda.app.components.models.model_library import parameter_counts
from pagoda.engine.async_engine import AsyncEngine
from tests.app.qt.greedy_chat import WAIT_MS, close_window, greedy_turn, real_window

pytestmark = pytest.mark.slow  # llama.cpp's converter, once a session (shared with the engine's)
REPLY_TOKENS = 8


def _parameters_in_all_and_a_tokens(folder) -> tuple[int, int]:
    """Counted from the folder's own tensors: a token reads top_k of each layer's experts."""
    config = transformers.AutoConfig.from_pretrained(folder)
    counts = {name: t.numel() for name, t in load_file(folder / "model.safetensors").items()}
    experts = sum(n for name, n in counts.items() if ".mlp.experts." in name)
    total = sum(counts.values())
    return total, total - experts + experts * config.num_experts_per_tok // config.num_experts


def _the_folders_greedy_reply(folder, prompt_ids: list[int]) -> str:
    """transformers' greedy continuation, each matrix rounded as the f16 file holds it (the
    routers and norms the converter keeps in fp32)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim >= 2 and not name.endswith("mlp.gate.weight"):
                parameter.copy_(parameter.half().float())
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=REPLY_TOKENS,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return tokenizer.decode(out[0, len(prompt_ids):], skip_special_tokens=True)


def _picker_texts(window) -> list[str]:
    return [window.model_picker.itemText(i) for i in range(window.model_picker.count())]


def test_a_mixture_of_experts_file_opened_from_the_picker_says_its_active_parameters_and_answers(
        moe_ggufs, qloop, qtbot, run_async, tmp_path, monkeypatch):
    folder, gguf = moe_ggufs["qwen3moe"]
    prompts: list[list[int]] = []
    stream = AsyncEngine.stream

    def noted(self, prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return stream(self, prompt, *args, **kwargs)

    monkeypatch.setattr(AsyncEngine, "stream", noted)
    window = real_window(qtbot, tmp_path / "chats.db")
    try:
        window.model_picker.activated.emit(window.model_picker.findText("Open model file…"))
        dialog = window.findChild(QFileDialog, "modelDialog")
        dialog.fileSelected.emit(str(gguf))
        dialog.reject()
        qtbot.waitUntil(lambda: window.host.is_ready, timeout=WAIT_MS)
        assert window.host.model_path == str(gguf)

        total, active = _parameters_in_all_and_a_tokens(folder)
        counts = parameter_counts(total, active)
        assert counts.endswith(" active") and counts.split(", ")[0] != counts.split(", ")[1]
        qtbot.waitUntil(lambda: window.model_picker.currentText().endswith(f" · {counts}"),
                        timeout=WAIT_MS)
        assert window.model_picker.currentText().startswith("tiny-qwen3moe · GGUF · fp16 · ")
        assert "each token goes through 4 of 16 experts" in window.model_picker.itemData(
            window.model_picker.currentIndex(), Qt.ItemDataRole.ToolTipRole)

        tab, reply, shown = greedy_turn(window, qtbot, run_async, "Which experts answer?",
                                        REPLY_TOKENS)
        assert (reply.status, reply.finish_reason) == ("complete", "length"), reply.error
        assert shown and "".join(delta for _, delta in shown) == reply.content
        assert tab.transcript.message_text(reply.id).strip() == reply.content.strip()
        assert reply.content == _the_folders_greedy_reply(folder, prompts[-1])
    finally:
        close_window(window)
