"""Settings → Documents: which saved server embeds documents' passages, and with which model, so
that retrieval finds passages by meaning as well as by words. A view of DocumentEmbeddings: it
shows the choice and its state, and forwards Use, Off and Test. Non-modal."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.backends import BackendError
from pagoda.app.components.documents.document_embeddings import (
    DocumentEmbeddings,
    EmbeddingsChoice,
    EmbeddingsState,
)
from pagoda.app.qt.shared.theme import ERROR_STYLE

DOCUMENTS_DIALOG = "documentsDialog"
OFF = "Off: find passages by their words only"
EXPLANATION = (
    "Passages of a chat's documents are always found by their words (bm25). With an embedding "
    "model on one of your saved servers, they are also found by meaning, and the two rankings "
    "are joined. The passages are sent to that server to be embedded: choose one you trust "
    "with your documents. Add servers with the model picker's “Add server…”.")


class DocumentsDialog(QDialog):
    """`spawn(coro)` runs the dialog's requests on the window's loop."""

    def __init__(self, embeddings: DocumentEmbeddings,
                 spawn: Callable[[Coroutine[Any, Any, Any]], Any],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName=DOCUMENTS_DIALOG, windowTitle="Documents")
        self.setStyleSheet(ERROR_STYLE)
        self.resize(620, 300)
        self.embeddings = embeddings
        self._spawn = spawn
        self.server = QComboBox(objectName="embeddingServer")
        self.model = QLineEdit(objectName="embeddingModel",
                               placeholderText="the embedding model there, e.g. nomic-embed-text")
        self.use_button = QPushButton("Use", objectName="useEmbeddings")
        self.test_button = QPushButton("Test", objectName="testEmbeddings")
        self.state_label = QLabel(objectName="embeddingsState", wordWrap=True)
        self.error_label = QLabel(objectName="embeddingsError", wordWrap=True, visible=False)
        self.error_label.setProperty("severity", "error")
        self._build()
        self.use_button.clicked.connect(self._use)
        self.test_button.clicked.connect(lambda: self._spawn(self._test()))
        self.server.currentIndexChanged.connect(lambda _i: self._edited())
        self.model.textChanged.connect(lambda _t: self._edited())
        self.refresh()

    def _build(self) -> None:
        form = QFormLayout()
        form.addRow("Embedding server", self.server)
        form.addRow("Model", self.model)
        buttons = QHBoxLayout()
        buttons.addWidget(self.use_button)
        buttons.addWidget(self.test_button)
        buttons.addStretch(1)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(EXPLANATION, wordWrap=True))
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.state_label)
        layout.addWidget(self.error_label)
        layout.addStretch(1)
        layout.addWidget(close)

    def refresh(self) -> None:
        """The saved servers, the current choice and its state."""
        self.server.blockSignals(True)
        self.server.clear()
        self.server.addItem(OFF, None)
        for connection in self.embeddings.connections.list():
            self.server.addItem(connection.label, connection.id)
        choice = self.embeddings.choice
        if choice is not None:
            self.server.setCurrentIndex(max(0, self.server.findData(choice.connection_id)))
            self.model.setText(choice.model)
        self.server.blockSignals(False)
        self.show_state(self.embeddings.state)
        self._edited()

    def _edited(self) -> None:
        """Use (or Turn off) is offered only where it would change something: Turn off while
        embeddings are on, Use for a server and model other than those in use."""
        off = self.server.currentData() is None
        model = self.model.text().strip()
        self.model.setEnabled(not off)
        self.use_button.setText("Turn off" if off else "Use")
        current = self.embeddings.choice
        if off:
            self.use_button.setEnabled(current is not None)
            self.use_button.setToolTip("" if current is not None
                                       else "Embeddings are off already.")
        else:
            in_use = current == EmbeddingsChoice(self.server.currentData(), model)
            self.use_button.setEnabled(bool(model) and not in_use)
            self.use_button.setToolTip("This server and model are in use." if in_use else "")
        self.test_button.setEnabled(self.embeddings.source is not None)

    def _use(self) -> None:
        connection_id = self.server.currentData()
        choice = None if connection_id is None else EmbeddingsChoice(connection_id,
                                                                     self.model.text())
        self._spawn(self._choose(choice))

    async def _choose(self, choice: EmbeddingsChoice | None) -> None:
        try:
            await self.embeddings.choose(choice)
        except ValueError as exc:
            self._show_error(str(exc))
            return
        self._show_error(None)
        self._edited()

    async def _test(self) -> None:
        self.test_button.setEnabled(False)
        try:
            said = await self.embeddings.try_it()
        except BackendError as exc:
            self._show_error(f"The test failed: {exc}")
        else:
            self._show_error(None)
            self.state_label.setText(f"Test: {said}.")
        finally:
            self.test_button.setEnabled(self.embeddings.source is not None)

    def show_state(self, state: EmbeddingsState) -> None:
        """What the embeddings are doing; the window calls this as it changes."""
        self.state_label.setText(f"Now: {state.text}")
        self.state_label.setProperty("severity", "error" if state.error else None)
        self.state_label.style().polish(self.state_label)

    def _show_error(self, text: str | None) -> None:
        self.error_label.setText(text or "")
        self.error_label.setVisible(bool(text))
