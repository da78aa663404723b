"""Admitting requests by the tokens of work they bring, not by their number: one client's batch
cannot queue unbounded work ahead of everyone else's."""

from __future__ import annotations

from pagoda.engine.server.errors import APIError

# Full contexts of work the server holds at once: 32 chats that may each fill the context, or
# many more short ones.
DEFAULT_WORK_CONTEXTS = 32


def choice_work(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """What one choice may cost: its prompt and the most it may generate, at most the context
    (where the engine stops it)."""
    return min(prompt_tokens + (max_model_len if max_tokens is None else max_tokens),
               max_model_len)


class Admission:
    """The work one request holds from admission until `release()` (once; again is a no-op)."""

    def __init__(self, budget: WorkBudget, work: int) -> None:
        self._budget = budget
        self.work = work
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._budget.in_flight -= self.work


class WorkBudget:
    """The tokens of work of the requests admitted and not yet ended, at most `contexts` full
    contexts of the model served. Used on the server's event loop only."""

    def __init__(self, contexts: int = DEFAULT_WORK_CONTEXTS) -> None:
        if not isinstance(contexts, int) or contexts < 1:
            raise ValueError(f"max_work_contexts={contexts!r} must be a positive integer")
        self.contexts = contexts
        self.in_flight = 0

    def limit(self, max_model_len: int) -> int:
        return self.contexts * max_model_len

    def admit(self, work: int, max_model_len: int) -> Admission:
        """Hold `work` tokens; APIError 400 for a request larger than the whole budget, 429
        while the requests in progress leave too little of it."""
        limit = self.limit(max_model_len)
        if work > limit:
            raise APIError(400, f"this request asks for {work} tokens of work (its prompts and "
                                f"max_tokens over all its choices), more than this server takes "
                                f"at once ({limit}: {self.contexts} contexts of {max_model_len} "
                                f"tokens): lower n or max_tokens, or send fewer prompts",
                           code="request_too_large")
        if self.in_flight + work > limit:
            raise APIError(429, f"the server is busy: requests in progress hold {self.in_flight} "
                                f"of the {limit} tokens of work it takes at once, and this one "
                                f"needs {work}: try again when some have finished",
                           code="server_busy")
        self.in_flight += work
        return Admission(self, work)
