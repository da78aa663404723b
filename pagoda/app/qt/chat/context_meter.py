"""How much of the model's context the conversation uses, and what happens when it runs out."""

from __future__ import annotations

from typing import Literal

from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

MeterState = Literal["ok", "warn", "full"]

WARN_FRACTION = 0.8
FULL_MESSAGE = (
    "The next reply may not fit: the oldest messages will be left out of what the model sees "
    "(they stay in the chat)"
)
STATE_STYLE = """
QProgressBar[state="warn"]::chunk { background-color: #e5a000; }
QProgressBar[state="full"]::chunk { background-color: #e5484d; }
QLabel[state="warn"] { color: #c98a00; }
QLabel[state="full"] { color: #e5484d; }
"""


def meter_state(used_tokens: int, context_len: int, reserve_tokens: int) -> MeterState:
    """ "full" when the reply's reserve no longer fits, "warn" from 80 % use, else "ok"."""
    if context_len <= 0:
        return "ok"  # no model loaded: nothing to compare with
    if used_tokens + reserve_tokens > context_len:
        return "full"
    if used_tokens >= WARN_FRACTION * context_len:
        return "warn"
    return "ok"


ESTIMATED_HINT = ("Estimated: this server does not count tokens for clients (or does not say "
                  "its context length), so the figures are approximate.")


def usage_text(used_tokens: int, context_len: int, exact: bool = True) -> str:
    """ "1,234 / 8,192 tokens", with "≈" before figures that are estimates."""
    about = "" if exact else "≈ "
    if context_len <= 0:
        return f"{about}{used_tokens:,} tokens"
    return f"{about}{used_tokens:,} / {context_len:,} tokens"


def meter_message(state: MeterState, used_tokens: int, context_len: int) -> str:
    if state == "full":
        return FULL_MESSAGE
    if state == "warn":
        share = used_tokens / context_len * 100
        return f"The conversation uses {share:.0f}% of the model's context."
    return ""


class ContextMeter(QWidget):
    """A label like "1,234 / 8,192 tokens" over a thin bar that turns amber, then red."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("contextMeter")
        self.setStyleSheet(STATE_STYLE)
        self.label = QLabel()
        self.label.setObjectName("contextMeterLabel")
        self.bar = QProgressBar()
        self.bar.setObjectName("contextMeterBar")
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(4)
        self.bar.setFixedWidth(120)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label)
        layout.addWidget(self.bar)
        self._state: MeterState = "ok"
        self._message = ""
        self.set_usage(0, 0, 0)

    def set_usage(self, used_tokens: int, context_len: int, reserve_tokens: int, *,
                  exact: bool = True) -> None:
        """Show `used_tokens` of `context_len`; `reserve_tokens` is the next reply's max tokens;
        `exact` False marks the figures as estimates."""
        state = meter_state(used_tokens, context_len, reserve_tokens)
        self._message = meter_message(state, used_tokens, context_len)
        self.label.setText(usage_text(used_tokens, context_len, exact))
        self.bar.setRange(0, max(context_len, 1))
        self.bar.setValue(min(max(used_tokens, 0), max(context_len, 1)))
        tooltip = self._message or self._reserve_hint(reserve_tokens)
        self.setToolTip(tooltip if exact else f"{tooltip}\n{ESTIMATED_HINT}")
        self._set_state(state)

    def state(self) -> MeterState:
        return self._state

    def message(self) -> str:
        """What the user should know about the current usage; empty when all is well."""
        return self._message

    @staticmethod
    def _reserve_hint(reserve_tokens: int) -> str:
        return f"Tokens the model sees, with {reserve_tokens:,} kept free for the next reply."

    def _set_state(self, state: MeterState) -> None:
        if state == self._state and self.bar.property("state") is not None:
            return
        self._state = state
        for widget in (self.label, self.bar):
            widget.setProperty("state", state)
            widget.style().unpolish(widget)
            widget.style().polish(widget)
