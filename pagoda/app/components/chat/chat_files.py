"""A chat's files as its session uses them: the documents and images waiting in the composer
and kept with each message, and the chat's folders, looked at again before each reply. No Qt."""

from __future__ import annotations

from pathlib import Path

from pagoda.app.backends import ChatBackend, ToolSpec
from pagoda.app.backends.images import count_chat, is_image_name, refusal
from pagoda.app.components.chat.prompting import chat_messages
from pagoda.app.components.chat.session_seam import FilesHost
from pagoda.app.components.documents.chat_documents import ChatDocuments, DocumentPrompt
from pagoda.app.components.documents.folder_index import ChatFolders, FolderError
from pagoda.app.components.images.pending_images import PendingImages
from pagoda.app.components.shared.view_models import ImageView
from pagoda.app.store import Message, StoreError


READING_FOLDERS = "looking for changes in the chat's folders…"


class ChatFiles:
    """`documents` and `images` (the composer's files and each message's) and `folders` of one
    session."""

    def __init__(self, session: FilesHost) -> None:
        self.session = session
        self.documents = ChatDocuments(session.db)
        self.documents.on_pending_changed = lambda views: session.view.show_pending_attachments(
            views)
        self.folders = ChatFolders(session.conversation_id, session.db)
        self.folders.on_changed = lambda views: session.view.show_folders(views)
        self.folders.on_settled = lambda: session.spawn(session.refresh_context_meter())
        self.folders.on_error = session.action_failed
        self.documents.folder_files = self.folders.documents
        self.images = PendingImages()
        self.images.on_changed = self._images_changed
        self.images.on_refused = lambda words: session.notify(
            f"This image cannot be used: {words}.", error=True)

    async def attach(self, paths: list[str]) -> None:
        """Files for the next message: read off the loop, shown waiting in the composer. A
        folder among them (dropped on the chat) becomes one of the chat's folders."""
        folders = [path for path in paths if Path(path).is_dir()]
        for folder in folders:
            await self.add_folder(folder)
        files = [path for path in paths if path not in folders]
        images = [path for path in files if is_image_name(path)]
        documents = [path for path in files if path not in images]
        if images:
            await self.images.add_files(images)
        if documents:
            await self.documents.attach(documents)
        await self.session.refresh_context_meter()

    async def paste_image(self, data: bytes) -> None:
        """An image pasted into the composer (the window's PNG of the clipboard's image)."""
        await self.images.add_pasted(data)
        await self.session.refresh_context_meter()

    def remove_pending_image(self, index: int) -> None:
        self.images.remove(index)
        self.session.spawn(self.session.refresh_context_meter())

    def images_refused(self) -> bool:
        """The composer, or the branch, holds images and the model takes text only: said in
        the notice, before anything is sent (the text and the images stay in the composer)."""
        words = self._images_refusal()
        if words is not None and self.images.images:
            self.session.notify(f"{words}. Your message and its images stay in the box.",
                                error=True)
        elif words is not None and any(m.images for m in self.session.path):
            self.session.notify(f"{words}, and this chat's earlier messages hold images: go on "
                                "with it on a server whose model sees images, or start a new "
                                "chat. Your message stays in the box.", error=True)
        else:
            return False
        return True

    def _images_refusal(self) -> str | None:
        backend = self.session.source.backend
        return None if backend is None else refusal(backend)

    def _images_changed(self, views: list[ImageView]) -> None:
        self.session.view.show_pending_images(views)
        words = self._images_refusal()
        if words is not None and views:
            self.session.notify(f"{words}: this message cannot be sent with its images.",
                                error=True)

    async def add_folder(self, path: str) -> None:
        """The chat answers from the folder's files too, indexed in the background; one that
        cannot be added is said in the chat's notice."""
        try:
            await self.folders.add(path)
        except (FolderError, StoreError) as exc:
            self.session.notify(f"This folder cannot be added: {exc}", error=True)

    async def remove_folder(self, folder_id: int) -> None:
        """The chat no longer answers from the folder; its index is deleted."""
        await self.folders.remove(folder_id)
        await self.session.refresh_context_meter()

    def remove_pending(self, index: int) -> None:
        self.documents.remove(index)
        self.session.spawn(self.session.refresh_context_meter())

    async def open_source(self, message_id: int, number: int) -> None:
        """Show the passage a reply cited as [number]."""
        message = next((m for m in self.session.path if m.id == message_id), None)
        citation = next((c for c in message.sources if c.number == number), None) \
            if message is not None else None
        if citation is None:
            return
        self.session.view.show_passage(await self.documents.passage(citation))

    def still_reading(self) -> bool:
        """A file of the composer is still being read: said in the notice."""
        name = self.documents.reading
        if name is not None:
            self.session.notify(
                f"{name} is still being read: send once it is ready (or remove it).")
        return name is not None

    async def prompt(self, backend: ChatBackend, branch: list[Message],
                     tools: tuple[ToolSpec, ...], message_id: int) -> DocumentPrompt:
        """The branch as the model is given it, with the branch's documents (and the chat's
        folders', looked at again first)."""
        await self._folders_ready(message_id)
        conversation = self.session.conversation
        messages = chat_messages(conversation.system_prompt, branch)
        return await self.documents.prompt(messages, branch,
                                           lambda kept, t: count_chat(backend, kept, t), tools,
                                           backend.max_model_len,
                                           conversation.sampling.max_tokens)

    async def _folders_ready(self, message_id: int) -> None:
        """The folders looked at again before the reply, and the few files changed since
        read; where a folder is still being indexed, the notice says the answer comes from what
        is indexed so far."""
        if not self.folders.views:
            return
        view = self.session.view
        view.show_reading(message_id, READING_FOLDERS)
        try:
            busy = await self.folders.before_question()
        finally:
            view.show_reading(message_id, None)
        if busy and not self.session.closed:
            verb = "is" if len(busy) == 1 else "are"
            self.session.notify(f"{', '.join(busy)} {verb} still being indexed: this answer "
                                "comes from the files indexed so far.")

    def close(self) -> None:
        self.folders.close()
        self.documents.close()
        self.images.close()
