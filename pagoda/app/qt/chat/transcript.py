"""The conversation on screen: one frame per message in a single QTextBrowser.

All messages share one QTextDocument so text can be selected across them, yet each message lives in
its own QTextFrame and is only ever rewritten inside that frame: a streamed delta is an insertText at
the end of the answer streamed so far, and a finished message is re-rendered as Markdown within its
frame alone.

Above an answer, a reply's reasoning folds under one "Thought for 12 s" line; below it, each tool call
the reply made, with Run / Always / Deny while it waits for the user, and the sources it was
given as links that open the passage. A tool's result is a compact frame of its own, folded to its
first line. A user's message shows the images it brought as thumbnails under its text (a click
opens one full size) and lists the documents it brought.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import partial

from PySide6.QtCore import QEvent, QPoint, QPointF, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFont,
    QGuiApplication,
    QPainter,
    QPaintEvent,
    QPalette,
    QResizeEvent,
    QShowEvent,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextFrame,
    QTextFrameFormat,
    QTextImageFormat,
)
from PySide6.QtWidgets import QTextBrowser, QToolButton, QVBoxLayout, QWidget

from pagoda.app.components.shared.view_models import MessageView, Role, ToolCallView
from pagoda.app.qt.chat.empty_hint import EmptyChatHint
from pagoda.app.qt.chat.image_views import DAMAGED, ImageViewer, size_text, thumbnail
from pagoda.app.qt.chat.markdown.markdown_render import (
    LINE_SEPARATOR,
    RenderStyle,
    code_char_format,
    insert_markdown,
    insert_plain_code,
    link_format,
)
from pagoda.app.qt.chat.markdown.quote_bars import QUOTE_INDENT, quote_bars
from pagoda.app.qt.chat.transcript_text import (
    ARGUMENTS_SHOWN,
    CALL_STATE_WORDS,
    THINKING,
    arguments_tooltip,
    compact_arguments,
    elide,
    result_preview,
    result_title,
    thought_label,
)
from pagoda.app.qt.documents.attachment_text import DOCUMENT_MARK, attachment_status, source_labels

logger = logging.getLogger(__name__)

ACTION_SCHEME = "pagoda"
EXTERNAL_SCHEMES = frozenset({"http", "https", "mailto"})
ROLE_LABELS: dict[Role, str] = {"user": "You", "assistant": "Assistant", "system": "System"}
GAP_HEIGHT = 6  # px between two messages
BUBBLE_INDENT = 48  # px: user messages sit to the right, assistant messages to the left
WRITING = "writing…"  # a streaming message's header, unless it says what it does instead
COPIED_FEEDBACK_MS = 1500  # how long a Copy link reads "Copied" after a click
BOTTOM_SLACK = 4  # px from the end that still counts as "at the bottom"
JUMP_MARGIN = 12  # px between the "Jump to latest" button and the transcript's bottom edge
# The links under a call waiting for the user, and the answer each gives the session.
CALL_DECISIONS = (("Run", "run"), ("Always for this tool", "always"), ("Deny", "deny"))
EMPTY_CHAT_HINT = ("Nothing here yet. Write a message in the box below and press Enter to send "
                   "it. The model picker at the top chooses what answers; Settings (Ctrl+,) "
                   "holds this chat's system prompt and sampling.")


@dataclass(slots=True)
class _Block:
    """A message as rendered: its frame in the document and what was drawn into it."""

    view: MessageView
    frame: QTextFrame
    chunks: list[str]
    streaming: bool
    can_regenerate: bool = False
    codes: list[str] = field(default_factory=list)
    activity: str | None = None  # while streaming, in place of "writing…" (say, reading a prompt)
    reasoning: list[str] = field(default_factory=list)
    # While streaming: where the next answer delta goes, and the next reasoning delta while the
    # reasoning is open. They move with the text (they are QTextCursors), past calls drawn below.
    answer_end: QTextCursor | None = None
    reasoning_end: QTextCursor | None = None

    def content(self) -> str:
        return _joined(self.chunks)

    def reasoning_text(self) -> str:
        return _joined(self.reasoning)


@dataclass(slots=True, frozen=True)
class _Colors:
    dark: bool
    user_background: QColor
    assistant_background: QColor
    system_background: QColor
    border: QColor
    quote_bar: QColor
    text: QColor
    muted: QColor
    link: QColor
    error: QColor
    card: QColor  # behind a tool call in its reply

    def background(self, role: Role) -> QColor:
        if role == "user":
            return self.user_background
        return self.system_background if role == "system" else self.assistant_background


class _TranscriptBrowser(QTextBrowser):
    """A QTextBrowser that loads no resources (images named by model output are never fetched)
    and draws a bar left of each block quote."""

    quote_bar_color = QColor("#d0d7de")

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        scrolled = QPointF(self.horizontalScrollBar().value(), self.verticalScrollBar().value())
        first = self.cursorForPosition(QPoint(0, 0)).block()
        bars = quote_bars(first, scrolled.y() + self.viewport().height())
        if bars:
            painter = QPainter(self.viewport())
            painter.translate(-scrolled)
            for bar in bars:
                painter.fillRect(bar, self.quote_bar_color)

    def loadResource(self, resource_type: int, name: QUrl) -> object:
        return None

    def showEvent(self, event: QShowEvent) -> None:
        # QTextEdit brings its text cursor into view on its first show; that is not the user
        # scrolling, and the transcript may be following its newest message.
        bar = self.verticalScrollBar()
        value = bar.value()
        was_blocked = bar.blockSignals(True)
        super().showEvent(event)
        bar.setValue(value)
        bar.blockSignals(was_blocked)


def ending_text(view: MessageView) -> str:
    """How a reply ended, when it did not simply finish: stopped by the user, interrupted by
    something else, or cut at the chat's max tokens."""
    if view.status == "interrupted":
        return "■ stopped" if view.finish_reason == "stopped" else "⚠ interrupted"
    if view.status == "complete" and view.finish_reason == "length":
        return cut_text(view.completion_tokens, view.max_tokens)
    return ""


def cut_text(written: int | None, max_tokens: int | None) -> str:
    """A reply cut at its max tokens: how long it is, and the chat's max tokens where that
    is not its length (a reply continued is longer; one that filled the context, shorter)."""
    if not written:
        return "✂ cut at the chat's max tokens"
    if max_tokens is None or written == max_tokens:
        return f"✂ cut at {written:,} tokens (the chat's max tokens)"
    if written > max_tokens:
        return (f"✂ cut at the chat's max tokens ({max_tokens:,} a reply) · {written:,} tokens "
                "in all")
    return f"✂ cut at {written:,} tokens (the context was full before the chat's {max_tokens:,})"


class TranscriptView(QWidget):
    """Renders the current branch of a conversation and emits what the user asks of a message."""

    branch_requested = Signal(int, int)  # message_id, direction (-1 or +1)
    edit_requested = Signal(int)  # a user message's id
    regenerate_requested = Signal(int)  # an assistant message's id
    continue_requested = Signal(int)  # a reply cut at its max tokens, or stopped
    # A call's answer: the reply's id, the call's place among its calls, "run"/"always"/"deny".
    tool_call_answered = Signal(int, int, str)
    source_requested = Signal(int, int)  # a reply's id, the number of the source clicked
    copied = Signal(str)
    IMAGE_SCHEME = "pagoda-image"  # the document's own resources: thumbnails, never fetched

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self._browser = _TranscriptBrowser(self)
        self._browser.setObjectName("transcriptText")
        self._browser.setOpenLinks(False)
        self._empty_hint = EmptyChatHint(EMPTY_CHAT_HINT, self._browser)
        self._browser.anchorClicked.connect(self._on_anchor_clicked)
        self._document = self._browser.document()
        self._document.setUndoRedoEnabled(False)
        self._token = secrets.token_hex(8)  # model output cannot forge our action links
        self._blocks: dict[int, _Block] = {}
        self._order: list[int] = []
        # Messages whose reasoning, or tool result, the user opened (kept for the view's life).
        self._open_reasoning: set[int] = set()
        self._open_results: set[int] = set()
        self._thumbnails: set[str] = set()  # the names of the thumbnails the document holds
        self.viewer: ImageViewer | None = None
        self._colors = self._palette_colors()
        self._browser.quote_bar_color = self._colors.quote_bar
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._browser)
        self.setFocusProxy(self._browser)
        # Whether the view keeps to the newest text: cleared when the user scrolls up, set when
        # they come back down, open a chat or send. Held as intent, not read off the scroll bar,
        # so that it survives layouts that finish later (first show, a resize).
        self._follows_bottom = True
        self._editing = False  # our own edits move the scroll bar; that is not the user scrolling
        bar = self._browser.verticalScrollBar()
        bar.rangeChanged.connect(self._on_scroll_range_changed)
        bar.valueChanged.connect(self._on_scrolled)
        self._jump = QToolButton(self)
        self._jump.setObjectName("jumpToLatest")
        self._jump.setText("Jump to latest ↓")
        self._jump.setCursor(Qt.CursorShape.PointingHandCursor)
        self._jump.clicked.connect(self.scroll_to_bottom)
        self._jump.hide()

    # -- what the controller calls ------------------------------------------------------------

    def set_messages(self, messages: Sequence[MessageView]) -> None:
        """Show `messages` (root to leaf); blocks already on screen and unchanged are kept."""
        target = _regenerate_target([(view, view.status == "streaming") for view in messages])
        keep = self._unchanged_prefix(messages, target)
        if keep == 0:
            self._follows_bottom = True  # another chat, or this one opened: show its newest message
        with self._own_edit():
            self._truncate(keep)
            for view in messages[keep:]:
                streaming = view.status == "streaming"
                self._append_block(view, streaming, can_regenerate=view.id == target)
        self._follow(grew=len(messages) > keep)

    def begin_stream(self, message: MessageView) -> None:
        """Add (or reset) an assistant block that will receive deltas as plain text."""
        block = self._blocks.get(message.id)
        if block is None:
            self._follows_bottom = True  # a new reply: the user just sent, show it
        with self._own_edit():
            if block is None:
                self._append_block(message, streaming=True, can_regenerate=False)
            else:
                self._replace(block, message, streaming=True)
            self._sync_regenerate()
        self._follow(grew=True)

    def append_delta(self, message_id: int, text: str) -> None:
        """Append streamed text to a streaming block's answer, re-rendering nothing (but its
        "Thinking…" line, once, when the answer starts)."""
        block = self._streaming_block(message_id)
        if block is None or not text:
            return
        thinking = self._is_thinking(block)
        block.chunks.append(text)
        with self._own_edit():
            if thinking:
                self._rerender(block)
            else:
                block.answer_end.insertText(text, QTextCharFormat())
        self._follow(grew=True)

    def append_reasoning(self, message_id: int, text: str) -> None:
        """Add streamed reasoning to a streaming block: kept aside while its reasoning is folded
        (the document is not touched), appended where the user opened it."""
        block = self._streaming_block(message_id)
        if block is None or not text:
            return
        first = not block.reasoning_text()
        block.reasoning.append(text)
        if not first and block.reasoning_end is None:
            return
        with self._own_edit():
            if first:
                self._rerender(block)  # its "Thinking…" line appears
            else:
                block.reasoning_end.insertText(_as_lines(text), self._reasoning_format())
        self._follow(grew=True)

    def _streaming_block(self, message_id: int) -> _Block | None:
        block = self._blocks.get(message_id)
        if block is None or not block.streaming:
            logger.debug("delta for message %s that is not streaming here", message_id)
            return None
        return block

    def show_activity(self, message_id: int, text: str | None) -> None:
        """Say in a streaming message's header what it is doing ("reading your message: 1,200 /
        3,300 tokens"); None goes back to "writing…"."""
        block = self._blocks.get(message_id)
        if block is None or not block.streaming or block.activity == text:
            return
        block.activity = text
        with self._own_edit():
            self._rerender(block)

    def activity_text(self, message_id: int) -> str | None:
        """The header's activity of a streaming message, None when it is not streaming."""
        block = self._blocks.get(message_id)
        if block is None or not block.streaming:
            return None
        return block.activity or WRITING

    def end_stream(self, message: MessageView) -> None:
        """Render the finished message as Markdown, with its stats and status; others stay as are."""
        self._update(message, streaming=False)

    def update_message(self, message: MessageView) -> None:
        """Re-render one message (e.g. its stats arrived); streaming if its status says so."""
        self._update(message, streaming=message.status == "streaming")

    # -- what tests and copy read ----------------------------------------------------------------

    def message_ids(self) -> list[int]:
        return list(self._order)

    def message_text(self, message_id: int) -> str:
        """The message's content as given (Markdown source, streamed text so far): a reply's
        answer without its reasoning, a tool message's result."""
        return self._blocks[message_id].content()

    def reasoning_text(self, message_id: int) -> str:
        """A reply's reasoning as streamed or stored, shown or folded."""
        return self._blocks[message_id].reasoning_text()

    def plain_text(self) -> str:
        """Everything the transcript shows, as plain text."""
        return self._document.toPlainText()

    def drop_area(self) -> QWidget:
        """The widget under the mouse when something is dragged over the transcript."""
        return self._browser.viewport()

    # -- blocks ---------------------------------------------------------------------------------

    def _update(self, message: MessageView, streaming: bool) -> None:
        block = self._blocks.get(message.id)
        if block is None:
            logger.debug("update for message %s that is not on screen", message.id)
            return
        with self._own_edit():
            self._replace(block, message, streaming, keep_streamed=streaming and block.streaming)
            self._sync_regenerate()
        self._follow(grew=False)

    def _unchanged_prefix(self, messages: Sequence[MessageView], target: int | None) -> int:
        keep = 0
        for message_id, view in zip(self._order, messages):
            block = self._blocks[message_id]
            same = block.view == view and not block.streaming and view.status != "streaming"
            if not same or block.can_regenerate != (view.id == target):
                break
            keep += 1
        return keep

    def _truncate(self, keep: int) -> None:
        cursor = QTextCursor(self._document)
        if keep:
            cursor.setPosition(self._blocks[self._order[keep - 1]].frame.lastPosition() + 1)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        for message_id in self._order[keep:]:
            del self._blocks[message_id]
        del self._order[keep:]

    def _append_block(self, view: MessageView, streaming: bool, can_regenerate: bool) -> None:
        cursor = QTextCursor(self._document)
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.beginEditBlock()
        frame = cursor.insertFrame(self._frame_format(view.role))
        block = _Block(view, frame, [view.content], streaming, can_regenerate,
                       reasoning=[view.reasoning or ""])
        self._fill(cursor, block)
        self._shrink_gaps_around(frame, before=not self._order)
        cursor.endEditBlock()
        self._blocks[view.id] = block
        self._order.append(view.id)

    def _shrink_gaps_around(self, frame: QTextFrame, before: bool) -> None:
        """Qt keeps an empty paragraph around every frame; make it a thin gap between messages."""
        gap = QTextBlockFormat()
        gap.setLineHeight(GAP_HEIGHT, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
        cursor = QTextCursor(self._document)
        positions = [frame.firstPosition() - 1] if before else []
        for position in [*positions, frame.lastPosition() + 1]:
            cursor.setPosition(position)
            cursor.setBlockFormat(gap)

    def _replace(
        self, block: _Block, view: MessageView, streaming: bool, keep_streamed: bool = False
    ) -> None:
        """Draw `view` in place of the block's message. `keep_streamed`: the view redraws a
        message still streaming (its calls' states), and may lag behind the deltas shown."""
        answer, reasoning = view.content, view.reasoning or ""
        if keep_streamed:
            answer = _newest(block.content(), answer)
            reasoning = _newest(block.reasoning_text(), reasoning)
        else:
            block.activity = None
        block.view, block.streaming = view, streaming
        block.chunks, block.reasoning = [answer], [reasoning]
        block.can_regenerate = self._regenerate_target() == view.id
        self._rerender(block)

    def _rerender(self, block: _Block) -> None:
        cursor = QTextCursor(self._document)
        cursor.beginEditBlock()
        cursor.setPosition(block.frame.firstPosition())
        cursor.setPosition(block.frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        block.frame.setFrameFormat(self._frame_format(block.view.role))
        self._fill(cursor, block)
        cursor.endEditBlock()

    def _fill(self, cursor: QTextCursor, block: _Block) -> None:
        """Draw a message into its (empty) frame, `cursor` standing at the frame's start."""
        block.codes, block.answer_end, block.reasoning_end = [], None, None
        if block.view.role == "tool":
            self._fill_result(cursor, block)
            return
        self._insert_header(cursor, block)
        reasoning_end = self._insert_reasoning(cursor, block) if block.reasoning_text() else None
        if block.streaming:
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            cursor.insertText(block.content(), QTextCharFormat())
            answer_end = cursor.position()
            self._insert_tool_calls(cursor, block.view)
            self._insert_sources(cursor, block.view)
            # Placed once all is drawn: a cursor standing where text is inserted moves with it.
            block.answer_end = self._cursor_at(answer_end)
            if reasoning_end is not None:
                block.reasoning_end = self._cursor_at(reasoning_end)
            return
        if block.content().strip():
            message_id = block.view.id
            block.codes = insert_markdown(cursor, block.content(), self._render_style(),
                                          lambda n: self._href("copy-code", message_id, n))
        self._insert_images(cursor, block.view)
        self._insert_attachments(cursor, block.view)
        self._insert_tool_calls(cursor, block.view)
        self._insert_sources(cursor, block.view)
        self._insert_footer(cursor, block.view)

    def _render_style(self) -> RenderStyle:
        colors = self._colors
        return RenderStyle(
            colors.dark, colors.muted, colors.link, colors.text, self.devicePixelRatioF()
        )

    def _cursor_at(self, position: int) -> QTextCursor:
        cursor = QTextCursor(self._document)
        cursor.setPosition(position)
        return cursor

    def _is_thinking(self, block: _Block) -> bool:
        """Reasoning streams and no answer has come yet."""
        return block.streaming and bool(block.reasoning_text()) and not block.content()

    def _regenerate_target(self) -> int | None:
        blocks = [self._blocks[i] for i in self._order]
        return _regenerate_target([(block.view, block.streaming) for block in blocks])

    def _sync_regenerate(self) -> None:
        target = self._regenerate_target()
        for message_id in self._order:
            block = self._blocks[message_id]
            if block.can_regenerate != (message_id == target):
                block.can_regenerate = message_id == target
                self._rerender(block)

    # -- drawing --------------------------------------------------------------------------------

    def _insert_header(self, cursor: QTextCursor, block: _Block) -> None:
        view = block.view
        header = QTextBlockFormat()
        header.setBottomMargin(4)
        cursor.setBlockFormat(header)
        role = QTextCharFormat()
        role.setFontWeight(QFont.Weight.Bold)
        cursor.insertText(ROLE_LABELS.get(view.role, view.role), role)
        cursor.insertText(f"  {_format_time(view.created_at)}", self._muted_format())
        if block.streaming:
            cursor.insertText(f"  · {block.activity or WRITING}", self._muted_format())
        if view.sibling_count > 1:
            self._insert_switcher(cursor, view)
        self._insert_actions(cursor, block)

    def _insert_switcher(self, cursor: QTextCursor, view: MessageView) -> None:
        cursor.insertText("    ", self._muted_format())
        self._insert_action(cursor, "‹", "branch", view.id, -1, enabled=view.sibling_index > 0)
        position = f" {view.sibling_index + 1}/{view.sibling_count} "
        cursor.insertText(position, self._muted_format())
        last = view.sibling_index >= view.sibling_count - 1
        self._insert_action(cursor, "›", "branch", view.id, 1, enabled=not last)

    def _insert_actions(self, cursor: QTextCursor, block: _Block) -> None:
        message_id = block.view.id
        cursor.insertText("    ", self._muted_format())
        if block.streaming or block.content() or not block.view.tool_calls:
            self._insert_action(cursor, "Copy", "copy", message_id)  # a reply of calls has none
        if block.view.role == "user":
            cursor.insertText("  ", self._muted_format())
            self._insert_action(cursor, "Edit", "edit", message_id)
        if block.can_regenerate:
            cursor.insertText("  ", self._muted_format())
            self._insert_action(cursor, "Regenerate", "regenerate", message_id)

    def _insert_action(
        self, cursor: QTextCursor, label: str, action: str, *args: int, enabled: bool = True
    ) -> None:
        if enabled:
            cursor.insertText(label, link_format(self._href(action, *args), self._colors.link))
        else:
            cursor.insertText(label, self._muted_format())

    def _insert_reasoning(self, cursor: QTextCursor, block: _Block) -> int | None:
        """The "Thought for 12 s" line that folds the reasoning, and the reasoning when opened;
        returns where the reasoning ends when it is shown."""
        view = block.view
        is_open = view.id in self._open_reasoning
        label = THINKING if self._is_thinking(block) else thought_label(view.reasoning_s)
        line = QTextBlockFormat()
        line.setBottomMargin(4)
        cursor.insertBlock(line, QTextCharFormat())
        toggle = link_format(self._href("reasoning", view.id), self._colors.muted)
        cursor.insertText(f"{'▾' if is_open else '▸'} {label}", toggle)
        if not is_open:
            return None
        quoted = QTextBlockFormat()
        quoted.setProperty(QTextFormat.Property.BlockQuoteLevel, 1)  # a bar left of it
        quoted.setLeftMargin(QUOTE_INDENT)
        quoted.setBottomMargin(6)
        cursor.insertBlock(quoted, self._reasoning_format())
        cursor.insertText(_as_lines(block.reasoning_text().lstrip("\n")), self._reasoning_format())
        return cursor.position()

    def _reasoning_format(self) -> QTextCharFormat:
        fmt = self._muted_format()
        fmt.setFontPointSize(max(self.font().pointSizeF() - 1.5, 7))
        return fmt

    def _insert_tool_calls(self, cursor: QTextCursor, view: MessageView) -> None:
        """One card per call the reply made: the function, its server, its arguments, and
        where it stands (Run / Always / Deny while it waits for the user)."""
        for index, call in enumerate(view.tool_calls):
            card = QTextBlockFormat()
            card.setBackground(self._colors.card)
            card.setTopMargin(8 if index == 0 else 4)
            cursor.insertBlock(card, QTextCharFormat())
            name = QTextCharFormat()
            name.setFontWeight(QFont.Weight.Bold)
            cursor.insertText(f" ⚙ {call.name}", name)
            if call.server:
                cursor.insertText(f"  {call.server}", self._muted_format())
            cursor.insertText("    ", self._muted_format())
            self._insert_call_state(cursor, view.id, index, call)
            card.setTopMargin(0)
            cursor.insertBlock(card, QTextCharFormat())
            self._insert_arguments(cursor, call.arguments)

    def _insert_call_state(
        self, cursor: QTextCursor, message_id: int, index: int, call: ToolCallView
    ) -> None:
        if call.state == "asking":
            for i, (label, decision) in enumerate(CALL_DECISIONS):
                if i:
                    cursor.insertText("  ·  ", self._muted_format())
                self._insert_action(cursor, label, f"call-{decision}", message_id, index)
            return
        fmt = self._muted_format()
        if call.state == "failed":
            fmt.setForeground(self._colors.error)
        cursor.insertText(CALL_STATE_WORDS[call.state], fmt)

    def _insert_arguments(self, cursor: QTextCursor, arguments: str) -> None:
        fmt = code_char_format()
        fmt.setForeground(self._colors.muted)
        fmt.setFontPointSize(max(self.font().pointSizeF() - 1, 7))
        shown = compact_arguments(arguments)
        if len(shown) > ARGUMENTS_SHOWN:
            fmt.setToolTip(arguments_tooltip(arguments))
        cursor.insertText(f" {elide(shown, ARGUMENTS_SHOWN)}", fmt)

    def _insert_images(self, cursor: QTextCursor, view: MessageView) -> None:
        """A user's message: its images as thumbnails on a line, each a link to its full view;
        one Qt cannot read (an imported chat's damaged bytes) is said in words."""
        if not view.images:
            return
        line = QTextBlockFormat()
        line.setTopMargin(6)
        cursor.insertBlock(line, QTextCharFormat())
        for index, image in enumerate(view.images):
            if index:
                cursor.insertText(" ", QTextCharFormat())
            name = self._thumbnail_resource(view.id, index, image.data)
            if name is None:
                cursor.insertText(f"{image.name}: {DAMAGED}", self._muted_format())
                continue
            picture = QTextImageFormat()
            picture.setName(name)
            picture.setAnchor(True)
            picture.setAnchorHref(self._href("image", view.id, index))
            picture.setToolTip(size_text(image))
            cursor.insertImage(picture)

    def _thumbnail_resource(self, message_id: int, index: int, data: bytes) -> str | None:
        """The name under which the document holds the image's thumbnail (made once: a sent
        message's images never change)."""
        name = f"{self.IMAGE_SCHEME}://{self._token}/{message_id}/{index}"
        if name not in self._thumbnails:
            image = thumbnail(data)
            if image is None:
                return None
            self._document.addResource(QTextDocument.ResourceType.ImageResource.value,
                                       QUrl(name), image)
            self._thumbnails.add(name)
        return name

    def thumbnail_sizes(self, message_id: int) -> list[tuple[int, int]]:
        """The thumbnails drawn in a message's frame, as (width, height) of their images."""
        block = self._blocks.get(message_id)
        if block is None:
            return []
        sizes = []
        it = block.frame.begin()
        while not it.atEnd():
            text_block = it.currentBlock()
            fragments = text_block.begin()
            while not fragments.atEnd():
                fmt = fragments.fragment().charFormat()
                if fmt.isImageFormat():
                    resource = self._document.resource(
                        QTextDocument.ResourceType.ImageResource.value,
                        QUrl(fmt.toImageFormat().name()))
                    sizes.append((resource.width(), resource.height()))
                fragments += 1
            it += 1
        return sizes

    def open_image(self, message_id: int, index: int) -> None:
        """Show a message's image at full size, beside the chat."""
        block = self._blocks.get(message_id)
        if block is None or not 0 <= index < len(block.view.images):
            return
        if self.viewer is None:
            self.viewer = ImageViewer(self)
        self.viewer.show_image(block.view.images[index])

    def _insert_attachments(self, cursor: QTextCursor, view: MessageView) -> None:
        """A user's message: a line per document it brought, "▤ report.pdf · 12 pages · 340 KB"."""
        for index, attachment in enumerate(view.attachments):
            line = QTextBlockFormat()
            line.setTopMargin(6 if index == 0 else 0)
            cursor.insertBlock(line, QTextCharFormat())
            name, details = self._muted_format(), self._muted_format()
            name.setForeground(self._colors.text)
            if attachment.state == "failed":
                details.setForeground(self._colors.error)
            cursor.insertText(f"{DOCUMENT_MARK} {attachment.name}", name)
            cursor.insertText(f" · {attachment_status(attachment)}", details)

    def _insert_sources(self, cursor: QTextCursor, view: MessageView) -> None:
        """A reply's sources, each a link that opens its passage: "Sources: [1] report.pdf, p. 12"."""
        if not view.sources:
            return
        line = QTextBlockFormat()
        line.setTopMargin(6)
        cursor.insertBlock(line, QTextCharFormat())
        cursor.insertText("Sources: ", self._muted_format())
        for index, (source, label) in enumerate(zip(view.sources, source_labels(view.sources),
                                                    strict=True)):
            if index:
                cursor.insertText("  ·  ", self._muted_format())
            self._insert_action(cursor, label, "source", view.id, source.number)

    def _fill_result(self, cursor: QTextCursor, block: _Block) -> None:
        """A tool message: what became of the call, then its result folded to a line, or
        opened as code."""
        view = block.view
        header = QTextBlockFormat()
        header.setBottomMargin(2)
        cursor.setBlockFormat(header)
        title = self._muted_format()
        title.setFontWeight(QFont.Weight.Bold)
        if view.finish_reason == "failed":
            title.setForeground(self._colors.error)
        cursor.insertText(result_title(view), title)
        cursor.insertText(f"  {_format_time(view.created_at)}    ", self._muted_format())
        self._insert_action(cursor, "Copy", "copy", view.id)
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        toggle = link_format(self._href("result", view.id), self._colors.muted)
        if view.id not in self._open_results:
            cursor.insertText(f"▸ {result_preview(block.content())}", toggle)
            return
        cursor.insertText("▾ hide the result", toggle)
        insert_plain_code(cursor, block.content().strip("\n"), self._render_style())

    def _insert_footer(self, cursor: QTextCursor, view: MessageView) -> None:
        parts: list[tuple[str, QTextCharFormat]] = []
        if view.stats_text:
            parts.append((view.stats_text, self._muted_format()))
        ending = ending_text(view)
        if ending:
            parts.append((ending, self._muted_format()))
        if view.status == "error":
            error = self._muted_format()
            error.setForeground(self._colors.error)
            parts.append((f"Error: {view.error}" if view.error else "Error", error))
        if not parts:
            return
        footer = QTextBlockFormat()
        footer.setTopMargin(6)
        cursor.insertBlock(footer, QTextCharFormat())
        for i, (text, fmt) in enumerate(parts):
            cursor.insertText(("  ·  " if i else "") + text, fmt)
        if view.can_continue:
            cursor.insertText("  ·  ", self._muted_format())
            self._insert_action(cursor, "Continue", "continue", view.id)

    def _muted_format(self) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(self._colors.muted)
        fmt.setFontPointSize(max(self.font().pointSizeF() - 1, 7))
        return fmt

    def _frame_format(self, role: Role) -> QTextFrameFormat:
        fmt = QTextFrameFormat()
        fmt.setBackground(self._colors.background(role))
        fmt.setBorder(1)
        fmt.setBorderBrush(self._colors.border)
        fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
        fmt.setPadding(6 if role == "tool" else 10)  # a tool's result is compact
        fmt.setTopMargin(4)
        fmt.setBottomMargin(4)
        fmt.setLeftMargin(BUBBLE_INDENT if role == "user" else 0)
        fmt.setRightMargin(0 if role == "user" else BUBBLE_INDENT)
        return fmt

    def _palette_colors(self) -> _Colors:
        palette = self.palette()
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        dark = base.lightnessF() < 0.5
        return _Colors(
            dark=dark,
            user_background=_mix(base, palette.color(QPalette.ColorRole.Highlight), 0.14),
            assistant_background=_mix(base, text, 0.04),
            system_background=_mix(base, text, 0.09),
            border=_mix(base, text, 0.15),
            quote_bar=_mix(base, text, 0.3),
            text=text,
            muted=_mix(text, base, 0.45),
            link=palette.color(QPalette.ColorRole.Link),
            error=QColor("#ef5350" if dark else "#c62828"),
            card=_mix(base, text, 0.08),
        )

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._colors = self._palette_colors()
            self._browser.quote_bar_color = self._colors.quote_bar
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.DevicePixelRatioChange):
            for message_id in self._order:  # formulas are drawn in the text's colour, at the ratio
                self._rerender(self._blocks[message_id])

    # -- actions and scrolling ------------------------------------------------------------------

    def _href(self, action: str, *args: int) -> str:
        return f"{ACTION_SCHEME}://{self._token}/{action}/" + "/".join(str(a) for a in args)

    def _on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() == ACTION_SCHEME and url.host() == self._token:
            action, *args = url.path().strip("/").split("/")
            self._run_action(action, [int(a) for a in args])
        elif url.scheme() in EXTERNAL_SCHEMES:
            QDesktopServices.openUrl(url)

    def _run_action(self, action: str, args: list[int]) -> None:
        block = self._blocks.get(args[0])
        if block is None:
            return
        if action == "copy":
            self._copy(block.content())
            self._show_copied(block.view.id, self._href(action, *args))
        elif action == "copy-code" and args[1] < len(block.codes):
            self._copy(block.codes[args[1]])
            self._show_copied(block.view.id, self._href(action, *args))
        elif action == "edit":
            self.edit_requested.emit(block.view.id)
        elif action == "regenerate":
            self.regenerate_requested.emit(block.view.id)
        elif action == "continue":
            self.continue_requested.emit(block.view.id)
        elif action == "branch":
            self.branch_requested.emit(block.view.id, args[1])
        elif action == "reasoning":
            self._toggle(self._open_reasoning, block)
        elif action == "result":
            self._toggle(self._open_results, block)
        elif action.startswith("call-"):
            self._answer_call(block, args[1], action.removeprefix("call-"))
        elif action == "image":
            self.open_image(block.view.id, args[1])
        elif action == "source" and any(s.number == args[1] for s in block.view.sources):
            self.source_requested.emit(block.view.id, args[1])

    def _toggle(self, opened: set[int], block: _Block) -> None:
        """Open or fold a message's reasoning or result, the view staying where the user is."""
        opened ^= {block.view.id}
        self._follows_bottom = False  # the text below the click moves, not the click
        with self._own_edit():
            self._rerender(block)
        self._follows_bottom = self._is_at_bottom()

    def _answer_call(self, block: _Block, index: int, decision: str) -> None:
        calls = block.view.tool_calls
        if index < len(calls) and calls[index].state == "asking":
            self.tool_call_answered.emit(block.view.id, index, decision)

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)

    def _show_copied(self, message_id: int, href: str) -> None:
        """Let the clicked Copy link read "Copied" for a moment; a re-render meanwhile resets it."""
        if self._relabel(message_id, href, "Copy", "Copied"):
            restore = partial(self._relabel, message_id, href, "Copied", "Copy")
            QTimer.singleShot(COPIED_FEEDBACK_MS, self, restore)

    def _relabel(self, message_id: int, href: str, old: str, new: str) -> bool:
        block = self._blocks.get(message_id)
        found = self._find_link(block.frame, href, old) if block is not None else None
        if found is None:
            return False
        cursor, fmt = found
        cursor.insertText(new, fmt)
        return True

    def _find_link(
        self, frame: QTextFrame, href: str, label: str
    ) -> tuple[QTextCursor, QTextCharFormat] | None:
        """A cursor selecting the link `label` to `href` inside `frame`, and the link's format."""
        text_block = self._document.findBlock(frame.firstPosition())
        while text_block.isValid() and text_block.position() <= frame.lastPosition():
            fragments = text_block.begin()
            while not fragments.atEnd():
                fragment = fragments.fragment()
                fmt = fragment.charFormat()
                if fmt.anchorHref() == href and fragment.text() == label:
                    cursor = QTextCursor(self._document)
                    cursor.setPosition(fragment.position())
                    end = fragment.position() + fragment.length()
                    cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
                    return cursor, fmt
                fragments += 1
            text_block = text_block.next()
        return None

    def scroll_to_bottom(self) -> None:
        """Show the newest text and keep following it (what "Jump to latest" does)."""
        self._follows_bottom = True
        bar = self._browser.verticalScrollBar()
        bar.setValue(bar.maximum())
        self._jump.hide()

    @contextmanager
    def _own_edit(self) -> Iterator[None]:
        self._editing = True
        try:
            yield
        finally:
            self._editing = False

    def _is_at_bottom(self) -> bool:
        bar = self._browser.verticalScrollBar()
        return bar.value() >= bar.maximum() - BOTTOM_SLACK

    def _follow(self, grew: bool) -> None:
        """After an edit: stay at the newest text, or offer to jump there if text was added."""
        if self._follows_bottom:
            self.scroll_to_bottom()
        elif grew and not self._is_at_bottom():
            self._show_jump()

    def _on_scroll_range_changed(self, _minimum: int, maximum: int) -> None:
        # The document's height settles after it is laid out (first show, a resize, a long
        # reply laid out in steps): keep to the bottom through all of it.
        if self._follows_bottom:
            self._browser.verticalScrollBar().setValue(maximum)

    def _on_scrolled(self, _value: int) -> None:
        if self._editing:
            return
        self._follows_bottom = self._is_at_bottom()
        if self._follows_bottom:
            self._jump.hide()

    def _show_jump(self) -> None:
        self._jump.adjustSize()
        self._place_jump()
        self._jump.show()
        self._jump.raise_()

    def _place_jump(self) -> None:
        viewport = self._browser.viewport().geometry()
        bottom = self._browser.geometry().top() + viewport.bottom()
        x = self._browser.geometry().left() + viewport.center().x() - self._jump.width() // 2
        self._jump.move(x, bottom - JUMP_MARGIN - self._jump.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._place_jump()


def _regenerate_target(entries: Sequence[tuple[MessageView, bool]]) -> int | None:
    """The message offering "Regenerate": the last assistant one, unless it is still streaming."""
    for view, streaming in reversed(entries):
        if view.role == "assistant":
            return None if streaming else view.id
    return None


def _joined(chunks: list[str]) -> str:
    """The chunks' text, joined once (they stay joined) rather than at every read."""
    if len(chunks) > 1:
        chunks[:] = ["".join(chunks)]
    return chunks[0] if chunks else ""


def _as_lines(text: str) -> str:
    """Newlines as line breaks within one paragraph: reasoning stays one quoted block."""
    return text.replace("\n", LINE_SEPARATOR)


def _newest(streamed: str, given: str) -> str:
    """The text streamed so far where `given` (a view's) has not caught up with it yet."""
    return streamed if streamed.startswith(given) else given


def _mix(color: QColor, other: QColor, amount: float) -> QColor:
    return QColor.fromRgbF(
        color.redF() + (other.redF() - color.redF()) * amount,
        color.greenF() + (other.greenF() - color.greenF()) * amount,
        color.blueF() + (other.blueF() - color.blueF()) * amount,
    )


def _format_time(moment: datetime) -> str:
    local = moment.astimezone() if moment.tzinfo else moment
    return local.strftime("%H:%M") if local.date() == date.today() else local.strftime("%Y-%m-%d %H:%M")
