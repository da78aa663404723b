"""How much of the model's context a chat fills: its branch, its documents, the tools it offers
and the message being typed with its images, counted with the backend's tokenizer off the loop
(an image at the backend's cost). No Qt."""

from __future__ import annotations

from pagoda.app.backends import BackendError, ChatBackend, ChatMessage
from pagoda.app.backends.images import count_chat
from pagoda.app.components.chat.prompting import FittedPrompt, chat_messages
from pagoda.app.components.chat.session_seam import MeterHost


class ContextMeter:
    """`usage`: (used, context, max_tokens) as last shown, or None before the first count."""

    def __init__(self, session: MeterHost) -> None:
        self.session = session
        self.usage: tuple[int, int, int] | None = None
        self._counts = 0

    async def refresh(self) -> None:
        """Count the branch (and the draft, if any) with the backend's tokenizer, off the loop;
        an older count that comes back after a newer one is dropped."""
        s = self.session
        backend = s.source.backend
        if backend is None or s.conversation is None:
            return
        self._counts += 1
        ticket = self._counts
        messages = chat_messages(s.conversation.system_prompt, s.path)
        images = tuple(s.files.images.images)
        if (s.draft.strip() or images) and not s.is_streaming:
            messages.append(ChatMessage("user", s.draft, images=images))
        used, exact = 0, True
        documents = s.files.documents
        if messages or documents.views:
            try:
                count = await documents.counted(
                    messages, s.path, lambda kept, tools: count_chat(backend, kept, tools),
                    s.turn.tools_in_prompt(),
                    backend.max_model_len, s.conversation.sampling.max_tokens)
            except BackendError:
                return  # the model is being switched: the new one's load refreshes the meter
            used, exact = count.n, count.exact and backend.max_model_len_known
        if not s.closed and ticket == self._counts:
            self.usage = (used, backend.max_model_len, s.conversation.sampling.max_tokens)
            s.view.show_context_usage(*self.usage, exact=exact)

    def show_prompt(self, backend: ChatBackend, fitted: FittedPrompt) -> None:
        """The meter shows what this reply reads, as soon as it is counted: a long paste is
        seen filling the context while it is read, not once the reply is done."""
        self._counts += 1  # a count still on its way is older than this one
        self.usage = (fitted.prompt_tokens, backend.max_model_len,
                      self.session.conversation.sampling.max_tokens)
        self.session.view.show_context_usage(*self.usage,
                                             exact=fitted.exact and backend.max_model_len_known)
