"""The side panel that edits one conversation's system prompt and sampling settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from PySide6.QtCore import QRegularExpression, Qt, QTimer, Signal
from PySide6.QtGui import QRegularExpressionValidator
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.backends import SAMPLING_FIELDS, SamplingField
from pagoda.app.components.view_models import SamplingView, ToolServerView
from pagoda.app.qt.widgets.fitted_tree import FittedTree

TEXT_DEBOUNCE_MS = 300
SYSTEM_PROMPT_MIN_LINES = 4
TARGET_TITLE_CHARS = 60  # of a chat's title in the panel's heading  # the box keeps this many lines however the panel is squeezed
RESET_DONE = "This chat's system prompt and sampling are back to the defaults for new chats."
RESET_TO_BUILT_IN = ("This chat's system prompt and sampling are back to the defaults for new "
                     "chats, which are Pagoda's built-in values (none of your own are saved).")
ALREADY_DEFAULTS = "This chat already uses the defaults for new chats: nothing to reset."
BUILT_IN_DONE = "This chat and new chats are back to Pagoda's built-in settings."
UNDONE = "Reset undone: this chat's settings are as they were."
MAX_TOKENS_CEILING = 32768
SEED_MAX = 2**31 - 1

# The sampling knobs' tooltips are the table's help (pagoda.engine.sampling.fields).
TOOLTIPS = {
    "system_prompt": "Instructions the model sees before every message of this conversation.",
    **{field.name: field.help for field in SAMPLING_FIELDS},
    "max_tokens": "The longest reply the model may write, in tokens.",
    "seed": "Fixes the random choices so a reply can be reproduced; empty picks a new one each time.",
    "enable_thinking": "Whether the model reasons before it answers, where its chat template "
                       "has a switch for it (Qwen3 and others).",
    "tools": "The MCP tools this chat's model may call; each call asks you first. Servers are "
             "added in Settings → Tools.",
}
THINKING_CHOICES: tuple[tuple[str, bool | None], ...] = (
    ("Model's default", None), ("On", True), ("Off", False))
NO_THINKING_SWITCH = "This model's chat template has no thinking switch."
NO_TOOL_SERVERS = "No tool servers yet: add MCP servers in Settings → Tools."
CHECKED, UNCHECKED = Qt.CheckState.Checked, Qt.CheckState.Unchecked


def _double_spin(minimum: float, maximum: float, step: float, decimals: int) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(minimum, maximum)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    box.setKeyboardTracking(False)  # one change per finished edit, not one per keystroke
    box.lineEdit().setTextMargins(6, 0, 0, 0)
    box.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
    return box


def _int_spin(minimum: int, maximum: int) -> QSpinBox:
    box = QSpinBox()
    box.setRange(minimum, maximum)
    box.setKeyboardTracking(False)
    box.lineEdit().setTextMargins(6, 0, 0, 0)
    box.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
    return box


def _sampling_spin(field: SamplingField) -> QAbstractSpinBox:
    """The spin box of a sampling knob, as its row of the table says."""
    spin = field.spin
    if field.kind is int:
        box = _int_spin(int(spin.low), int(spin.high))
        box.setSingleStep(int(spin.step))
    else:
        box = _double_spin(spin.low, spin.high, spin.step, spin.decimals)
    if spin.off_text:
        box.setSpecialValueText(spin.off_text)
    return box


def _spin_value(field: SamplingField, box: QAbstractSpinBox) -> int | float:
    """What the box shows: a float rounded to the decimals it shows (no 0.7000000001)."""
    return box.value() if field.kind is int else round(box.value(), field.spin.decimals)


def _lines_high(box: QPlainTextEdit, lines: int) -> int:
    """The height that shows `lines` lines of text in `box`, its margins and frame included."""
    margins = box.contentsMargins()
    chrome = 2 * box.document().documentMargin() + margins.top() + margins.bottom()
    return int(lines * box.fontMetrics().lineSpacing() + chrome)


@dataclass(slots=True, frozen=True)
class _BeforeReset:
    """What a reset changed: the chat's settings and the defaults for new chats before it."""

    settings: SamplingView
    defaults: SamplingView


class SettingsPanel(QWidget):
    """Edits the current chat's SamplingView; emits `settings_changed(SamplingView)` only for the
    user's edits (a reset and its Undo included), `defaults_requested(SamplingView)` when the
    user makes them the defaults for new chats (or Undo gives back those that Pagoda's
    built-in values replaced), and `built_in_defaults_requested()` when new chats should start
    with the built-in values again. It says which chat it edits (`set_target`) and what a
    reset did, with Undo until the next edit or another chat is shown."""

    settings_changed = Signal(object)
    defaults_requested = Signal(object)
    built_in_defaults_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("settingsPanel")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)  # let the theme paint it
        self._applying = False
        self._defaults = SamplingView()
        self._shown = SamplingView()  # the last settings shown: fields no widget edits
        self._before_reset: _BeforeReset | None = None  # what Undo gives back
        self._build_widgets()
        self._build_layout()
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(TEXT_DEBOUNCE_MS)
        self._debounce.timeout.connect(self._emit_settings)
        self._connect_edits()
        self.set_settings(SamplingView())

    def _build_widgets(self) -> None:
        self.system_prompt_edit = QPlainTextEdit()
        self.system_prompt_edit.setPlaceholderText("You are a helpful assistant.")
        self.system_prompt_edit.setMinimumHeight(_lines_high(self.system_prompt_edit,
                                                             SYSTEM_PROMPT_MIN_LINES))
        # A row per sampling knob of the table, by its name.
        self.sampling_spins = {field.name: _sampling_spin(field) for field in SAMPLING_FIELDS}
        self.max_tokens_spin = _int_spin(1, MAX_TOKENS_CEILING)
        self.max_tokens_spin.setSingleStep(64)
        self.seed_edit = QLineEdit()
        self.seed_edit.setPlaceholderText("Random")
        self.seed_edit.setValidator(
            QRegularExpressionValidator(QRegularExpression(r"\d{0,10}"), self.seed_edit)
        )
        self.thinking_combo = QComboBox()
        for text, value in THINKING_CHOICES:
            self.thinking_combo.addItem(text, value)
        self.tools_tree = FittedTree()
        self.tools_tree.setHeaderHidden(True)
        self.no_tools_label = QLabel(NO_TOOL_SERVERS, objectName="noToolServers", wordWrap=True)
        self.target_label = QLabel("This chat")
        self.target_label.setObjectName("settingsTarget")
        self.target_label.setWordWrap(True)
        self.reset_button = QPushButton("Reset to defaults", objectName="resetButton")
        self.reset_button.setToolTip(
            "Give this chat the defaults for new chats: their system prompt and sampling. "
            "Undo brings its own back."
        )
        self.note_label = QLabel(objectName="settingsNote", wordWrap=True)
        self.note_label.hide()
        self.undo_reset_button = QPushButton("Undo", objectName="undoReset")
        self.undo_reset_button.setToolTip("Give this chat back the settings it had before the reset")
        self.restore_built_in_button = QPushButton("Use Pagoda's built-in values",
                                                   objectName="restoreBuiltIn")
        self.restore_built_in_button.setToolTip(
            "Pagoda's own settings, for this chat and as the defaults for new chats")
        for button in (self.undo_reset_button, self.restore_built_in_button):
            button.hide()
        self.make_default_button = QPushButton("Use as default for new chats")
        self.make_default_button.setObjectName("makeDefaultButton")
        self.make_default_button.setToolTip(
            "New chats will start with this system prompt and these sampling settings; "
            "existing chats keep their own."
        )

    def _fields(self) -> list[tuple[str, str, QWidget]]:
        return [
            ("system_prompt", "System prompt", self.system_prompt_edit),
            *((field.name, field.label, self.sampling_spins[field.name])
              for field in SAMPLING_FIELDS),
            ("max_tokens", "Max tokens", self.max_tokens_spin),
            ("seed", "Seed", self.seed_edit),
            ("enable_thinking", "Thinking", self.thinking_combo),
            ("tools", "Tools", self.tools_tree),
        ]

    def _build_layout(self) -> None:
        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        for key, text, widget in self._fields():
            label = QLabel(text)
            label.setObjectName(f"{key}Label")
            label.setToolTip(TOOLTIPS[key])
            label.setBuddy(widget)
            widget.setObjectName(key)
            widget.setToolTip(TOOLTIPS[key])
            if key in ("system_prompt", "tools"):
                form.addRow(label)
                form.addRow(widget)
            else:
                form.addRow(label, widget)
        layout = QVBoxLayout(self)
        layout.addWidget(self.target_label)
        layout.addLayout(form)
        layout.addWidget(self.no_tools_label)
        buttons = QHBoxLayout()
        buttons.addWidget(self.make_default_button)
        buttons.addStretch(1)
        buttons.addWidget(self.reset_button)
        layout.addLayout(buttons)
        layout.addWidget(self.note_label)
        after_reset = QHBoxLayout()
        after_reset.addWidget(self.undo_reset_button)
        after_reset.addWidget(self.restore_built_in_button)
        after_reset.addStretch(1)
        layout.addLayout(after_reset)
        layout.addStretch(1)

    def _connect_edits(self) -> None:
        self.system_prompt_edit.textChanged.connect(self._on_text_edited)
        self.seed_edit.textEdited.connect(self._on_text_edited)
        for box in (*self.sampling_spins.values(), self.max_tokens_spin):
            box.valueChanged.connect(self._on_value_edited)
        self.thinking_combo.currentIndexChanged.connect(self._on_value_edited)
        self.tools_tree.itemChanged.connect(self._on_tool_checked)
        self.reset_button.clicked.connect(self.reset_to_defaults)
        self.undo_reset_button.clicked.connect(self.undo_reset)
        self.restore_built_in_button.clicked.connect(self.restore_built_in_values)
        self.make_default_button.clicked.connect(
            lambda: self.defaults_requested.emit(self.settings()))

    def set_target(self, title: str) -> None:
        """Name the chat these settings belong to (a long title cut here, whole in the
        tooltip)."""
        shown = title if len(title) <= TARGET_TITLE_CHARS else (
            title[:TARGET_TITLE_CHARS - 1].rstrip() + "…")
        self.target_label.setText(f"Settings of “{shown}” (this chat only)")
        self.target_label.setToolTip(title if shown != title else "")

    def set_defaults(self, defaults: SamplingView) -> None:
        """The defaults for new chats, which "Reset to defaults" restores."""
        self._defaults = defaults

    def set_settings(self, settings: SamplingView) -> None:
        """Show `settings` without emitting `settings_changed`; out-of-range values are clamped."""
        self._debounce.stop()
        self._show_note("")
        self._applying = True
        try:
            self._apply_to_widgets(settings)
        finally:
            self._applying = False

    def set_thinking_switch(self, available: bool) -> None:
        """Whether the model in service has a thinking switch; without one the choice stays
        (for a model that has one) but is greyed out, and says why."""
        self.thinking_combo.setEnabled(available)
        self.thinking_combo.setToolTip(TOOLTIPS["enable_thinking"] if available
                                       else NO_THINKING_SWITCH)

    def set_tool_servers(self, servers: Sequence[ToolServerView]) -> None:
        """The MCP servers and their tools a chat may turn on (checked where the chat has)."""
        self._applying = True
        try:
            self.tools_tree.clear()
            for server in servers:
                self._add_server_item(server)
            self._check_tools(self._shown.tools)
        finally:
            self._applying = False
        self.tools_tree.setVisible(bool(servers))
        self.no_tools_label.setVisible(not servers)

    def _add_server_item(self, server: ToolServerView) -> None:
        item = QTreeWidgetItem([server.name if not server.state
                                else f"{server.name} ({server.state})"])
        item.setData(0, Qt.ItemDataRole.UserRole, server.name)
        item.setCheckState(0, UNCHECKED)
        item.setToolTip(0, f"Every tool of {server.name}")
        for name, description in server.tools:
            child = QTreeWidgetItem([name])
            child.setData(0, Qt.ItemDataRole.UserRole, f"{server.name}/{name}")
            child.setToolTip(0, description)
            child.setCheckState(0, UNCHECKED)
            item.addChild(child)
        self.tools_tree.addTopLevelItem(item)
        item.setExpanded(False)

    def _check_tools(self, selectors: tuple[str, ...]) -> None:
        for i in range(self.tools_tree.topLevelItemCount()):
            server = self.tools_tree.topLevelItem(i)
            whole = server.data(0, Qt.ItemDataRole.UserRole) in selectors
            server.setCheckState(0, CHECKED if whole else UNCHECKED)
            for j in range(server.childCount()):
                child = server.child(j)
                chosen = whole or child.data(0, Qt.ItemDataRole.UserRole) in selectors
                child.setCheckState(0, CHECKED if chosen else UNCHECKED)

    def _chosen_tools(self) -> tuple[str, ...]:
        """The selectors the tree shows: a server checked whole, else its checked tools; a
        selector for a server not listed now (removed, or not yet read) is kept."""
        listed, chosen = set(), []
        for i in range(self.tools_tree.topLevelItemCount()):
            server = self.tools_tree.topLevelItem(i)
            name = server.data(0, Qt.ItemDataRole.UserRole)
            listed.add(name)
            if server.checkState(0) == CHECKED:
                chosen.append(name)
                continue
            for j in range(server.childCount()):
                child = server.child(j)
                if child.checkState(0) == CHECKED:
                    chosen.append(child.data(0, Qt.ItemDataRole.UserRole))
        kept = [s for s in self._shown.tools if s.split("/", 1)[0] not in listed]
        return tuple(kept + chosen)

    def _on_tool_checked(self, item: QTreeWidgetItem, _column: int) -> None:
        if self._applying:
            return
        self._applying = True
        try:
            if item.parent() is None:  # a server: all of its tools follow it
                for j in range(item.childCount()):
                    item.child(j).setCheckState(0, item.checkState(0))
            elif item.checkState(0) == UNCHECKED:
                item.parent().setCheckState(0, UNCHECKED)
        finally:
            self._applying = False
        self._on_value_edited()

    def _apply_to_widgets(self, settings: SamplingView) -> None:
        self._shown = settings
        self.thinking_combo.setCurrentIndex(
            [value for _text, value in THINKING_CHOICES].index(settings.enable_thinking))
        self._check_tools(settings.tools)
        if self.system_prompt_edit.toPlainText() != settings.system_prompt:
            self.system_prompt_edit.setPlainText(settings.system_prompt)
        for name, box in self.sampling_spins.items():
            box.setValue(getattr(settings, name))
        self.max_tokens_spin.setValue(settings.max_tokens)
        seed = None if settings.seed is None else min(max(settings.seed, 0), SEED_MAX)
        self.seed_edit.setText("" if seed is None else str(seed))

    def settings(self) -> SamplingView:
        """The settings as the widgets show them now."""
        return replace(
            self._shown,
            system_prompt=self.system_prompt_edit.toPlainText(),
            **{field.name: _spin_value(field, self.sampling_spins[field.name])
               for field in SAMPLING_FIELDS},
            max_tokens=self.max_tokens_spin.value(),
            seed=self._seed(),
            enable_thinking=self.thinking_combo.currentData(),
            tools=self._chosen_tools(),
        )

    def _seed(self) -> int | None:
        text = self.seed_edit.text().strip()
        return min(int(text), SEED_MAX) if text else None

    def set_max_tokens_limit(self, limit: int) -> None:
        """Cap max tokens at the model's context; a larger value is lowered without a signal."""
        self._applying = True
        try:
            self.max_tokens_spin.setMaximum(min(max(limit, 1), MAX_TOKENS_CEILING))
        finally:
            self._applying = False

    def reset_to_defaults(self) -> None:
        """Give this chat the defaults for new chats, system prompt included; say what it did,
        with Undo (and Pagoda's built-in values, where the defaults are the user's own)."""
        own_defaults = self._defaults != SamplingView()
        if self.settings() == self._clamped(self._defaults):
            self._show_note(ALREADY_DEFAULTS, built_in=own_defaults)
            return
        before = _BeforeReset(self.settings(), self._defaults)
        self.set_settings(self._defaults)
        self._emit_settings()
        self._show_note(RESET_DONE if own_defaults else RESET_TO_BUILT_IN, before,
                        built_in=own_defaults)

    def restore_built_in_values(self) -> None:
        """Pagoda's own values, for this chat and as the defaults for new chats; Undo gives back
        both as they were before (before the reset that offered this, if one did)."""
        before = self._before_reset or _BeforeReset(self.settings(), self._defaults)
        self._defaults = SamplingView()
        self.set_settings(self._defaults)
        self._emit_settings()
        self.built_in_defaults_requested.emit()
        self._show_note(BUILT_IN_DONE, before)

    def undo_reset(self) -> None:
        """The chat's settings as they were before the last reset, and the defaults for new
        chats too where it changed them."""
        before = self._before_reset
        if before is None:
            return
        self.set_settings(before.settings)
        self._emit_settings()
        if before.defaults != self._defaults:
            self._defaults = before.defaults
            self.defaults_requested.emit(before.defaults)
        self._show_note(UNDONE)

    def note(self) -> str:
        """What the last reset did, as the panel says it ("" when nothing is said)."""
        return self.note_label.text()

    def _show_note(self, text: str, before: _BeforeReset | None = None,
                   built_in: bool = False) -> None:
        """Say `text`; offer Undo while `before` can be given back, and Pagoda's built-in
        values where `built_in`. An edit, or another chat shown, ends both."""
        self._before_reset = before
        self.note_label.setText(text)
        self.note_label.setVisible(bool(text))
        self.undo_reset_button.setVisible(before is not None)
        self.restore_built_in_button.setVisible(built_in)

    def _clamped(self, settings: SamplingView) -> SamplingView:
        """`settings` as the widgets would show them (a max tokens above the model's context is
        lowered)."""
        return replace(settings, max_tokens=min(settings.max_tokens,
                                                self.max_tokens_spin.maximum()))

    def _on_text_edited(self) -> None:
        if not self._applying:
            self._show_note("")
            self._debounce.start()

    def _on_value_edited(self) -> None:
        if not self._applying:
            self._show_note("")
            self._emit_settings()

    def _emit_settings(self) -> None:
        self._debounce.stop()  # what is emitted now already includes any pending text edit
        self._shown = self.settings()  # a later refresh of the tools keeps the user's choice
        self.settings_changed.emit(self._shown)
