"""The conversation list with search: pinned first, then recent; a context menu per chat, the
chats writing a reply marked, and New chat and Import above."""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime

from PySide6.QtCore import (
    QEvent,
    QItemSelectionModel,
    QModelIndex,
    QPoint,
    QRect,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QIcon, QKeyEvent, QMouseEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStackedWidget,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.qt.shared.theme import icon

SEARCH_DEBOUNCE_MS = 250
ID_ROLE = Qt.ItemDataRole.UserRole
MESSAGE_ROLE = Qt.ItemDataRole.UserRole + 1


@dataclass(slots=True, frozen=True)
class ConversationItem:
    id: int
    title: str
    updated_at: datetime
    pinned: bool
    archived: bool = False


@dataclass(slots=True, frozen=True)
class SearchResultItem:
    conversation_id: int
    message_id: int
    title: str
    snippet_html: str  # already escaped, matches in <b>


class _SearchBox(QLineEdit):
    """A line edit where Esc clears the query (and so leaves the results) before anything else."""

    cleared = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() == Qt.Key.Key_Escape and self.text():
            self.clear()
            self.cleared.emit()
            return
        super().keyPressEvent(event)


class _ChatList(QListWidget):
    """The list of chats. A right click opens the chat's menu without making it the current
    row: the current row stays the chat whose tab is current (the menu marks its own row while
    it is open)."""

    def mousePressEvent(self, event: QMouseEvent) -> None:
        if event.button() == Qt.MouseButton.RightButton:
            event.accept()  # the context menu comes from its own event, which still arrives
            return
        super().mousePressEvent(event)


class _TitleDelegate(QStyledItemDelegate):
    """Gives the rename editor the whole row, and at least the height its own text needs.

    The default puts it in the row's text rectangle, where the theme's padding leaves a strip
    too thin to read.
    """

    def updateEditorGeometry(self, editor: QWidget, option: QStyleOptionViewItem,
                             index: QModelIndex) -> None:
        row = option.rect
        height = max(row.height(), editor.sizeHint().height())
        top = max(0, row.center().y() - (height - 1) // 2)  # the first row's stays whole
        editor.setGeometry(QRect(row.left(), top, row.width(), height))


class Sidebar(QWidget):
    """Signals: open_requested(conversation id, message id or 0), new_requested(),
    search_requested(str) (debounced; "" clears), rename_requested(id, title),
    pin_requested(id, bool), archive_requested(id, bool), delete_requested(id),
    export_requested(id), import_requested() (Import… above the list, or a chat's menu),
    show_archived_changed(bool) (the "Show archived" switch below the list).
    """

    open_requested = Signal(int, int)
    new_requested = Signal()
    search_requested = Signal(str)
    rename_requested = Signal(int, str)
    pin_requested = Signal(int, bool)
    archive_requested = Signal(int, bool)
    delete_requested = Signal(int)
    export_requested = Signal(int)
    import_requested = Signal()
    show_archived_changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.new_button = QPushButton("New chat", self, objectName="newChatButton")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.import_button = QPushButton("Import…", self, objectName="importChatsButton")
        self.import_button.setToolTip("Import chats from a Pagoda export (a .json file)")
        self.search_box = _SearchBox(self, objectName="searchBox", clearButtonEnabled=True)
        self.search_box.setPlaceholderText("Search all chats (Esc clears)")
        self.conversation_list = _ChatList(self, objectName="conversationList")
        self.results_list = QListWidget(self, objectName="searchResults")
        self.show_archived = QCheckBox("Show archived chats", self, objectName="showArchived")
        self.show_archived.setToolTip("List archived chats too (greyed); their menu unarchives them")
        for view in (self.conversation_list, self.results_list):
            view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
            view.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.results_list.setWordWrap(True)
        self.conversation_list.setItemDelegate(_TitleDelegate(self.conversation_list))
        line = self.conversation_list.fontMetrics().height()
        self.conversation_list.setIconSize(QSize(line, line))  # the pin keeps rows one line tall
        self._stack = QStackedWidget(self)
        self._stack.addWidget(self.conversation_list)
        self._stack.addWidget(self.results_list)
        self._items: dict[int, ConversationItem] = {}
        self._writing: set[int] = set()  # the chats writing a reply now
        self._debounce = QTimer(self, singleShot=True, interval=SEARCH_DEBOUNCE_MS)
        self._layout()
        self._connect()

    def _layout(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        header = QHBoxLayout()
        header.addWidget(self.new_button, 1)
        header.addWidget(self.import_button)
        layout.addLayout(header)
        layout.addWidget(self.search_box)
        layout.addWidget(self._stack, 1)
        layout.addWidget(self.show_archived)

    def _connect(self) -> None:
        self.new_button.clicked.connect(self.new_requested)
        self.import_button.clicked.connect(self.import_requested)
        self.search_box.textChanged.connect(lambda _text: self._debounce.start())
        self._debounce.timeout.connect(self._search_now)
        self.search_box.cleared.connect(self._search_now)
        self.conversation_list.itemActivated.connect(self._open_item)
        self.conversation_list.itemClicked.connect(self._open_item)
        self.results_list.itemActivated.connect(self._open_item)
        self.results_list.itemClicked.connect(self._open_item)
        self.conversation_list.itemChanged.connect(self._renamed)
        self.conversation_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.conversation_list.customContextMenuRequested.connect(self._context_menu)
        self.show_archived.toggled.connect(self.show_archived_changed)

    def _search_now(self) -> None:
        self._debounce.stop()
        query = self.search_box.text().strip()
        self._stack.setCurrentWidget(self.results_list if query else self.conversation_list)
        self.search_requested.emit(query)

    # -- conversations -----------------------------------------------------------------------

    def set_conversations(self, items: list[ConversationItem]) -> None:
        """Show the list as given (the store orders it: pinned first, then most recent). The
        same list again (a reply ended) leaves the rows as they are, a rename in progress too."""
        if list(self._items.values()) == items:
            return
        current = self.current_conversation_id()
        self.conversation_list.blockSignals(True)
        self.conversation_list.clear()
        self._items = {item.id: item for item in items}
        for item in items:
            row = QListWidgetItem(item.title)
            row.setData(ID_ROLE, item.id)
            if item.archived:
                row.setForeground(self.palette().placeholderText())
            row.setFlags(row.flags() | Qt.ItemFlag.ItemIsEditable)
            self._decorate(row)
            self.conversation_list.addItem(row)
        self.conversation_list.blockSignals(False)
        self.select_conversation(current)

    def show_writing(self, conversation_id: int, writing: bool) -> None:
        """Mark the chat's row while it writes a reply (kept across refreshes of the list)."""
        if writing:
            self._writing.add(conversation_id)
        else:
            self._writing.discard(conversation_id)
        row = self._row_of(conversation_id)
        if row is not None:
            self._decorate(row)

    def is_writing(self, conversation_id: int) -> bool:
        """Whether the chat's row shows that it writes a reply."""
        return conversation_id in self._writing and self._row_of(conversation_id) is not None

    def _decorate(self, row: QListWidgetItem) -> None:
        """The row's icon (writing, else the pin) and tooltip."""
        item = self._items[row.data(ID_ROLE)]
        writing = item.id in self._writing
        row.setIcon(icon("writing") if writing else icon("pin") if item.pinned else QIcon())
        states = [text for text, on in (("Writing a reply…", writing), ("Archived", item.archived),
                                        ("Pinned", item.pinned)) if on]
        last_active = f"Last active {item.updated_at.astimezone():%Y-%m-%d %H:%M}"
        row.setToolTip(f"{item.title}\n{' · '.join([*states, last_active])}")

    def _row_of(self, conversation_id: int) -> QListWidgetItem | None:
        for index in range(self.conversation_list.count()):
            row = self.conversation_list.item(index)
            if row.data(ID_ROLE) == conversation_id:
                return row
        return None

    def select_conversation(self, conversation_id: int | None) -> None:
        item = self._row_of(conversation_id) if conversation_id is not None else None
        if item is not None:
            self.conversation_list.blockSignals(True)
            self.conversation_list.setCurrentItem(item)
            self.conversation_list.blockSignals(False)

    def current_conversation_id(self) -> int | None:
        item = self.conversation_list.currentItem()
        return None if item is None else item.data(ID_ROLE)

    def title_of(self, conversation_id: int) -> str | None:
        """The chat's title as listed; None when it is not in the list."""
        item = self._items.get(conversation_id)
        return item.title if item is not None else None

    def conversation_titles(self) -> list[str]:
        return [self._items[self.conversation_list.item(r).data(ID_ROLE)].title
                for r in range(self.conversation_list.count())]

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._repaint_icons()

    def _repaint_icons(self) -> None:
        """Icons are painted in the palette's text color, so a theme change needs new ones."""
        for row in range(self.conversation_list.count()):
            self._decorate(self.conversation_list.item(row))

    def _open_item(self, item: QListWidgetItem) -> None:
        message_id = item.data(MESSAGE_ROLE) or 0
        self.open_requested.emit(item.data(ID_ROLE), message_id)

    def _renamed(self, item: QListWidgetItem) -> None:
        cid = item.data(ID_ROLE)
        title = item.text().strip()
        if cid in self._items and title and title != self._items[cid].title:
            self.rename_requested.emit(cid, title)

    def _context_menu(self, pos: QPoint) -> None:
        item = self.conversation_list.itemAt(pos)
        menu = self.build_context_menu(None if item is None else item.data(ID_ROLE))
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        if item is not None:
            self._mark(item)
            menu.aboutToHide.connect(self._unmark)
        menu.popup(self.conversation_list.viewport().mapToGlobal(pos))

    def _mark(self, item: QListWidgetItem) -> None:
        """Highlight the row a menu acts on, leaving the current row where it is."""
        chats = self.conversation_list
        chats.selectionModel().select(chats.indexFromItem(item),
                                      QItemSelectionModel.SelectionFlag.ClearAndSelect)

    def _unmark(self) -> None:
        """The highlight goes back to the current chat's row."""
        chats = self.conversation_list
        current = chats.currentItem()
        if current is None:
            chats.clearSelection()
        else:
            chats.selectionModel().select(chats.indexFromItem(current),
                                          QItemSelectionModel.SelectionFlag.ClearAndSelect)

    def marked_conversation_id(self) -> int | None:
        """The chat whose row is highlighted: the current one, or the one a menu acts on."""
        selected = self.conversation_list.selectedItems()
        return selected[0].data(ID_ROLE) if selected else None

    def build_context_menu(self, conversation_id: int | None) -> QMenu:
        """A chat's menu; below the chats (None), only Import chats…."""
        menu = QMenu(self)
        if conversation_id is None:
            menu.addAction("Import chats…", self.import_requested.emit)
            return menu
        conversation = self._items[conversation_id]
        menu.addAction("Rename", lambda: self._edit_title(conversation_id))
        menu.addAction("Unpin" if conversation.pinned else "Pin",
                       lambda: self.pin_requested.emit(conversation_id, not conversation.pinned))
        menu.addAction("Unarchive" if conversation.archived else "Archive",
                       lambda: self.archive_requested.emit(conversation_id,
                                                           not conversation.archived))
        menu.addAction("Export…", lambda: self.export_requested.emit(conversation_id))
        menu.addAction("Import chats…", self.import_requested.emit)
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete_requested.emit(conversation_id))
        return menu

    def _edit_title(self, conversation_id: int) -> None:
        item = self._row_of(conversation_id)
        if item is not None:
            self.conversation_list.editItem(item)

    # -- search ------------------------------------------------------------------------------

    def set_search_results(self, results: list[SearchResultItem]) -> None:
        self.results_list.clear()
        if not results:
            empty = QListWidgetItem("No messages match.")
            empty.setFlags(Qt.ItemFlag.NoItemFlags)
            self.results_list.addItem(empty)
            return
        for result in results:
            row = QListWidgetItem()
            row.setData(ID_ROLE, result.conversation_id)
            row.setData(MESSAGE_ROLE, result.message_id)
            label = QLabel(f"<b>{html.escape(result.title)}</b><br>{result.snippet_html}",
                           wordWrap=True, textFormat=Qt.TextFormat.RichText)
            label.setContentsMargins(4, 4, 4, 4)
            row.setSizeHint(label.sizeHint())
            self.results_list.addItem(row)
            self.results_list.setItemWidget(row, label)

    def search_result_count(self) -> int:
        return sum(1 for r in range(self.results_list.count())
                   if self.results_list.item(r).data(ID_ROLE) is not None)
