"""The main window's status bar: the current chat's backend (the engine here: state, device,
load and cache figures; a server: what this client measures of it), and the local API server's
address while it serves."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from pagoda.app.backends import BackendStats
from pagoda.app.components.shared.view_models import EngineStatusView, LoadStepView, LocalServerView
from pagoda.app.qt.shared.elide import elided, with_whole_text
from pagoda.app.qt.shared.theme import ERROR_STYLE

SEPARATOR = " · "
PROGRESS_STEPS = 1000  # of the load's progress bar


def state_text(status: EngineStatusView) -> str:
    """The engine's state in words, e.g. "Ready · cpu"."""
    if status.state == "loading":
        return loading_text(status)
    if status.state == "error":
        return f"Error: {status.detail}" if status.detail else "Engine error"
    return f"Ready{SEPARATOR}{status.device}" if status.device else "Ready"


def loading_text(status: EngineStatusView) -> str:
    """E.g. "Loading SmolLM2-135M-Instruct… 73%: building the model (step 5 of 6)"."""
    text = f"Loading {status.model or 'the model'}…"
    return f"{text} {load_step_text(status.load)}" if status.load is not None else text


def load_step_text(step: LoadStepView) -> str:
    """E.g. "73%: building the model (step 5 of 6)": the whole load's share, the figure the
    progress bars and the picker show, then the step under way."""
    return f"{percent(step.share)}: {step.words} (step {step.number} of {step.steps})"


def picker_loading_mark(step: LoadStepView | None) -> str:
    """What the model picker's entry of the model loading now reads before its name, e.g.
    "Loading 52%", so that it does not look ready."""
    return "Loading…" if step is None else f"Loading {percent(step.share)}"


def requests_text(status: EngineStatusView) -> str:
    return f"{status.num_running} running{SEPARATOR}{status.num_waiting} waiting"


def throughput_text(tokens_per_s: float) -> str:
    if tokens_per_s >= 100:
        return f"{tokens_per_s:,.0f} tok/s"
    return f"{tokens_per_s:.1f} tok/s"


def server_text(server: LocalServerView) -> str:
    """E.g. "API: http://127.0.0.1:8000 · 2 requests"; empty while the server is off."""
    if server.address is None:
        return ""
    count = server.running_requests
    return f"API: {server.address}{SEPARATOR}{count} request{'' if count == 1 else 's'}"


def remote_requests_text(stats: BackendStats) -> str:
    """This client's replies running there; the server's queue only where it says."""
    text = f"{stats.num_running} running"
    return text if stats.num_waiting is None else f"{text}{SEPARATOR}{stats.num_waiting} waiting"


MEMORY_EXPLAINED = ("The memory Pagoda holds now (its resident set): the model's weights, its "
                    "KV cache, the window and the chats open in it.")


def memory_text(num_bytes: int) -> str:
    """E.g. "Memory 452 MB", "Memory 1.8 GB" (decimal units, as system monitors show)."""
    if num_bytes < 1e9:
        return f"Memory {num_bytes / 1e6:.0f} MB"
    return f"Memory {num_bytes / 1e9:.1f} GB"


def kv_cache_text(usage: float) -> str:
    return f"KV cache {percent(usage)}"


def prefix_hits_text(rate: float) -> str:
    return f"Prefix hits {percent(rate)}"


SPEC_EXPLAINED = ("Speed-up (speculative decoding): the engine guesses the next few tokens from "
                  "the text so far and checks the guesses in one step, which is faster only "
                  "when enough of them are right; it turns itself on and off as that changes.")


def spec_accept_text(rate: float) -> str:
    return f"Speed-up: {percent(rate)} of guesses kept"


def spec_text(status: EngineStatusView) -> str | None:
    """Whether the engine's guessing ahead is on now ("Speed-up off"), else how many of its
    guesses are kept; None while it does not guess at all."""
    if status.spec_status:
        # The engine's headline reads "drafts on: …" or "drafts off: …" (DraftPlan.headline).
        return "Speed-up on" if status.spec_status.startswith("drafts on") else "Speed-up off"
    if status.spec_acceptance_rate is not None:
        return spec_accept_text(status.spec_acceptance_rate)
    return None


def spec_tooltip(status: EngineStatusView) -> str:
    """What the speed-up is, then the engine's reason for its state now."""
    reason = _sentence(status.spec_reason)
    return f"{SPEC_EXPLAINED}\nNow: {reason}" if reason else SPEC_EXPLAINED


def percent(fraction: float) -> str:
    return f"{min(max(fraction, 0.0), 1.0) * 100:.0f}%"


class EngineStatusBar(QStatusBar):
    """Renders an EngineStatusView; cheap to call often: only changed text reaches Qt."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("statusBar")
        self.setStyleSheet(ERROR_STYLE)
        self.state_label = self._add_label("engineState")
        self.progress = QProgressBar()
        self.progress.setObjectName("loadingProgress")
        self.progress.setRange(0, 0)  # indeterminate until the load says how far it is
        self.progress.setTextVisible(False)
        self.progress.setFixedWidth(120)
        self.addPermanentWidget(self.progress)
        self.requests_label = self._add_label("engineRequests")
        self.throughput_label = self._add_label("engineThroughput")
        self.kv_cache_label = self._add_label("engineKvCache")
        self.prefix_cache_label = self._add_label("enginePrefixCache")
        self.spec_label = self._add_label("engineSpecAcceptance")
        self.ttft_label = self._add_label("backendTtft")
        self._metric_labels = (
            self.requests_label,
            self.throughput_label,
            self.ttft_label,
            self.kv_cache_label,
            self.prefix_cache_label,
            self.spec_label,
        )
        self.memory_label = self._add_label("appMemory")
        self.memory_label.setToolTip(MEMORY_EXPLAINED)
        self.server_label = self._add_label("apiServer")
        self.server_label.setToolTip("Pagoda's local OpenAI-compatible server (Settings) and "
                                     "the API requests it is answering")
        self._texts: dict[str, str] = {}  # objectName -> text last given to Qt
        self._visible: dict[str, bool] = {}
        self._tooltip = ""
        self._severity = ""
        for widget in (self.progress, *self._metric_labels, self.memory_label, self.server_label):
            self._set_visible(widget, False)

    def _add_label(self, name: str) -> QLabel:
        label = QLabel()
        label.setObjectName(name)
        self.addPermanentWidget(label)
        return label

    def show_status(self, status: EngineStatusView) -> None:
        """Show `status`; parts that did not change since the last call are left alone."""
        self._show_state(state_text(status), status.model)
        self._set_severity("error" if status.state == "error" else "")
        self._set_visible(self.progress, status.state == "loading")
        show_share(self.progress, status.load)
        ready = status.state == "ready"
        spec = spec_text(status)
        speculating = spec is not None
        for label in self._metric_labels:
            self._set_visible(label, ready and label is not self.ttft_label
                              and (speculating or label is not self.spec_label))
        if ready:
            self._set_text(self.requests_label, requests_text(status))
            self._set_text(self.throughput_label, throughput_text(status.tokens_per_s))
            self._set_text(self.kv_cache_label, kv_cache_text(status.kv_cache_usage))
            self._set_text(self.prefix_cache_label,
                           prefix_hits_text(status.prefix_cache_hit_rate))
            if speculating:
                self._set_text(self.spec_label, spec)
                self._set_label_tooltip(self.spec_label, spec_tooltip(status))

    def show_remote(self, label: str, stats: BackendStats) -> None:
        """The current chat's server: its name and what this client measures of it; figures the
        server does not report (its KV cache, its queue) are not shown rather than shown as 0."""
        self._show_state(f"Remote{SEPARATOR}{label}",
                         f"Replies in this chat come from {label}; the figures are measured "
                         "by Pagoda as they arrive.")
        self._set_severity("")
        self._set_visible(self.progress, False)
        shown = {
            self.requests_label: remote_requests_text(stats),
            self.throughput_label: throughput_text(stats.tokens_per_s),
            self.ttft_label: (None if stats.time_to_first_token is None
                              else f"TTFT {stats.time_to_first_token:.2f} s"),
            self.kv_cache_label: (None if stats.kv_cache_usage is None
                                  else kv_cache_text(stats.kv_cache_usage)),
            self.prefix_cache_label: (None if stats.prefix_cache_hit_rate is None
                                      else prefix_hits_text(stats.prefix_cache_hit_rate)),
            self.spec_label: (None if stats.spec_acceptance_rate is None
                              else spec_accept_text(stats.spec_acceptance_rate)),
        }
        for widget, text in shown.items():
            self._set_visible(widget, text is not None)
            if text is not None:
                self._set_text(widget, text)

    def show_memory(self, num_bytes: int | None) -> None:
        """This process's memory, whichever chat is current; nothing where it is unknown."""
        self._set_visible(self.memory_label, num_bytes is not None)
        if num_bytes is not None:
            self._set_text(self.memory_label, memory_text(num_bytes))

    def show_server(self, server: LocalServerView) -> None:
        """Show the local server's address and running API requests, or nothing while it is off."""
        text = server_text(server)
        self._set_visible(self.server_label, bool(text))
        if text:
            self._set_text(self.server_label, text)

    def summary_text(self) -> str:
        """Everything the bar shows now, as one line."""
        shown = [label for label in (*self._metric_labels, self.memory_label, self.server_label)
                 if self._is_shown(label)]
        return " | ".join(self._texts.get(label.objectName(), label.text())
                          for label in (self.state_label, *shown))

    def is_loading(self) -> bool:
        """Whether the indeterminate progress bar is showing."""
        return self._is_shown(self.progress)

    def is_error(self) -> bool:
        """Whether the state is shown as an error (in red)."""
        return self._severity == "error"

    def _is_shown(self, widget: QWidget) -> bool:
        return self._visible.get(widget.objectName(), False)

    def _set_text(self, label: QLabel, text: str) -> str:
        """Shows `text` (the state, which names a model, cut to a bounded width); returns what
        is shown."""
        if self._texts.get(label.objectName()) != text:
            self._texts[label.objectName()] = text
            shown = (elided(text, label.fontMetrics())
                     if label is self.state_label else text)
            label.setText(shown)
        return label.text()

    def _show_state(self, text: str, tooltip: str) -> None:
        tooltip = with_whole_text(self._set_text(self.state_label, text), text, tooltip)
        if self._tooltip != tooltip:
            self._tooltip = tooltip
            self.state_label.setToolTip(tooltip)

    def _set_label_tooltip(self, label: QLabel, text: str) -> None:
        if label.toolTip() != text:
            label.setToolTip(text)

    def _set_visible(self, widget: QWidget, visible: bool) -> None:
        if self._visible.get(widget.objectName()) != visible:
            self._visible[widget.objectName()] = visible
            widget.setVisible(visible)

    def _set_severity(self, severity: str) -> None:
        if severity == self._severity:
            return
        self._severity = severity
        self.state_label.setProperty("severity", severity)
        self.state_label.style().unpolish(self.state_label)
        self.state_label.style().polish(self.state_label)


def show_share(bar: QProgressBar, step: LoadStepView | None) -> None:
    """The load's share done on `bar`; moving to and fro where it is not known."""
    maximum = 0 if step is None else PROGRESS_STEPS
    value = 0 if step is None else round(step.share * PROGRESS_STEPS)
    if bar.maximum() != maximum:
        bar.setRange(0, maximum)
    if bar.value() != value:
        bar.setValue(value)


def _sentence(text: str | None) -> str:
    """"drafts off: ... here" as a sentence for a tooltip; "" for none."""
    return f"{text[:1].upper()}{text[1:]}." if text else ""
