"""Joins an AddServerFlow (the work) to an AddServerDialog (the widgets) on the qasync loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QWidget

from pagoda.app.backends.errors import BackendError
from pagoda.app.components.shared.connections import AddServerFlow, ServerConnection
from pagoda.app.qt.server.add_server_dialog import AddServerDialog
from pagoda.app.store import StoreError

logger = logging.getLogger(__name__)


def open_add_server_dialog(parent: QWidget, flow: AddServerFlow,
                           on_added: Callable[[ServerConnection], None]) -> AddServerDialog:
    """Show the non-modal "Add a server" dialog over a fresh `flow`. Once a server is saved,
    `on_added(connection)` is called and the dialog closes; it is deleted when closed."""
    dialog = AddServerDialog(parent)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    AddServerPresenter(flow, dialog, on_added)
    dialog.show()
    return dialog


class AddServerPresenter(QObject):
    """Runs the dialog's requests as the flow's coroutines and renders the flow after each
    change. Lives as long as the dialog; stops listening to the flow when it closes."""

    def __init__(self, flow: AddServerFlow, dialog: AddServerDialog,
                 on_added: Callable[[ServerConnection], None]) -> None:
        super().__init__(dialog)
        self.flow = flow
        self.dialog = dialog
        self._on_added = on_added
        self._shown_models: tuple[str, ...] | None = None
        self._tasks: set[asyncio.Future] = set()
        self._closed = False
        self._unsubscribe = flow.subscribe(self.render)
        dialog.finished.connect(self._close)
        dialog.probe_requested.connect(lambda url, key: self._spawn(flow.probe(url, key)))
        dialog.add_requested.connect(lambda _url, _key, model: self._spawn(self._add(model)))
        self.render()

    def render(self) -> None:
        flow, dialog = self.flow, self.dialog
        dialog.set_busy(flow.busy)
        # Only a new list is rendered: re-rendering would undo the user's choice of model.
        if flow.models != self._shown_models:
            self._shown_models = flow.models
            dialog.show_models(flow.models, flow.model)
        dialog.show_error(flow.error)
        dialog.show_notice(flow.notice)

    def _close(self) -> None:
        self._closed = True
        self._unsubscribe()

    async def _add(self, model: str) -> None:
        try:
            connection = await self.flow.add(model)
        except (BackendError, StoreError):
            return  # the flow's error, shown by render
        self._on_added(connection)
        self.dialog.accept()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        logger.error("adding a server failed", exc_info=task.exception())
        if not self._closed:
            self.dialog.show_error(f"Something went wrong: {task.exception()}")
