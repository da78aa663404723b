"""What can go wrong with a backend, as the tab tells the user. Each message names the backend
(a server's address, or the engine on this computer) and what to do about it."""

from __future__ import annotations


def clause(said: object) -> str:
    """Someone else's message (an exception's, a server's) to quote inside one of our
    sentences: without its final full stop, so the sentence does not end in "..". An ellipsis
    is kept."""
    text = str(said).strip()
    return text[:-1] if text.endswith(".") and not text.endswith("..") else text


class BackendError(Exception):
    """A reply could not be had, or was cut short.

    `partial_text` is the reply received before the failure ("" when none was): the chunks that
    carried it were already yielded, so the app keeps it and marks the reply interrupted.
    """

    def __init__(self, message: str, *, partial_text: str = "") -> None:
        super().__init__(message)
        self.partial_text = partial_text


class ModelLoadingError(BackendError):
    """No request can start now: a model is loading, or none has loaded."""


class BackendUnreachableError(BackendError):
    """No connection: refused, no such host, or the connect timed out."""


class BackendNotAnsweringError(BackendError):
    """The server took the connection but sent no answer in time."""


class UnauthorizedError(BackendError):
    """The server refused the API key (HTTP 401 or 403)."""


class ModelNotFoundError(BackendError):
    """The server does not serve the model asked for (HTTP 404), or serves none."""


class InvalidRequestError(BackendError):
    """The backend refused the request as given (HTTP 400): a sampling value out of range."""


class ImagesRefusedError(InvalidRequestError):
    """The model does not take the chat's images (a text-only model, or a server's refusal)."""


class PromptTooLongError(InvalidRequestError):
    """The chat does not fit the model's context."""


class ServerError(BackendError):
    """The backend failed the request (HTTP 5xx or 429, or an error sent mid-reply). `status`
    is the HTTP status, None when the failure came inside the stream or from the engine."""

    def __init__(self, message: str, *, status: int | None = None,
                 partial_text: str = "") -> None:
        super().__init__(message, partial_text=partial_text)
        self.status = status


class MalformedStreamError(BackendError):
    """The server answered with something that is not an OpenAI-style chat stream."""


class ConnectionDroppedError(BackendError):
    """The connection closed before the reply was complete."""


class BackendStoppedError(BackendError):
    """The backend was shut down (or its engine died): it serves no more replies."""


class InvalidAddressError(BackendError, ValueError):
    """A server address that is not an http:// or https:// URL."""
