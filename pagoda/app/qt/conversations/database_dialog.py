"""At start, a database Pagoda cannot use: the store's message, "Choose another file…" or "Quit"."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from pagoda.app.store.errors import StoreError

CHOOSE = "Choose another file…"
QUIT = "Quit"
DATABASE_FILTER = "Pagoda database (*.db);;All files (*)"


def database_error_box(error: StoreError, parent: QWidget | None = None) -> QMessageBox:
    """The message box; its buttons are CHOOSE (the default) and QUIT."""
    box = QMessageBox(QMessageBox.Icon.Critical, "Pagoda cannot open its database", str(error),
                      QMessageBox.StandardButton.NoButton, parent)
    box.setObjectName("databaseErrorDialog")
    box.setInformativeText("Choose another file to keep your chats in, or quit.")
    box.setDefaultButton(box.addButton(CHOOSE, QMessageBox.ButtonRole.AcceptRole))
    box.setEscapeButton(box.addButton(QUIT, QMessageBox.ButtonRole.RejectRole))
    return box


def database_file_dialog(parent: QWidget | None = None) -> QFileDialog:
    """A save-style picker: a new file is created, an existing Pagoda database is opened as is."""
    dialog = QFileDialog(parent, "Choose a file for your chats", str(Path.home()), DATABASE_FILTER)
    dialog.setObjectName("databaseFileDialog")
    dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
    dialog.setOption(QFileDialog.Option.DontConfirmOverwrite)
    dialog.setDefaultSuffix("db")
    dialog.selectFile("pagoda.db")
    return dialog


def ask_for_another_database(error: StoreError) -> Path | None:
    """Modal, before the app's event loop runs: the file the user picks, or None for Quit.
    Cancelling the picker shows the message again."""
    while True:
        box = database_error_box(error)
        box.exec()
        if box.clickedButton() is not box.defaultButton():
            return None
        dialog = database_file_dialog()
        if dialog.exec() == QFileDialog.DialogCode.Accepted and dialog.selectedFiles():
            return Path(dialog.selectedFiles()[0])
