"""Shows a new API key once, to copy: Pagoda keeps only its SHA-256 and cannot show it again."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

EXPLANATION = ("Copy this key now and give it to the programs that use the local server "
               "(Authorization: Bearer <key>, or the openai client's api_key). Pagoda keeps "
               "only a fingerprint of it and cannot show it again; if it is lost, generate a "
               "new one.")


def show_new_api_key(parent: QWidget, key: str) -> QDialog:
    """Non-blocking; the dialog, and the key with it, is deleted when closed."""
    dialog = QDialog(parent, objectName="newApiKeyDialog", windowTitle="New API key")
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    field = QLineEdit(key, objectName="newApiKey", readOnly=True)
    field.setMinimumWidth(field.fontMetrics().horizontalAdvance(key) + 24)
    field.selectAll()
    copy = QPushButton("Copy", objectName="copyApiKey")
    copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(key))
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
    buttons.addButton(copy, QDialogButtonBox.ButtonRole.ActionRole)
    buttons.rejected.connect(dialog.reject)
    layout = QVBoxLayout(dialog)
    layout.addWidget(QLabel(EXPLANATION, wordWrap=True))
    layout.addWidget(field)
    layout.addWidget(buttons)
    dialog.open()
    return dialog
