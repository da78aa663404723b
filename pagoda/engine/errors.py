"""Exceptions a user can cause. Each message names the thing at fault and how to fix it."""


class PagodaError(Exception):
    """Base class for errors Pagoda reports to users."""


class ModelLoadError(PagodaError):
    """A model source could not be turned into config, tokenizer and weights."""


class PromptTooLongError(PagodaError, ValueError):
    """A prompt does not fit the model's context window."""


class EngineDeadError(PagodaError, RuntimeError):
    """The engine thread has stopped; no new requests can be served."""


class RequestAbortedError(PagodaError, RuntimeError):
    """A request was aborted (its server or engine stopping) before its result was made."""


class RequestFailedError(PagodaError, RuntimeError):
    """The engine step that ran a request failed; the engine serves on, the request is lost."""


class InvalidTextError(PagodaError, ValueError):
    """Text handed to the engine is not valid Unicode (a lone surrogate)."""


class HubUnreachableError(PagodaError, ConnectionError):
    """The Hugging Face Hub cannot be reached: no network, or offline mode is on."""


class HubAccessError(PagodaError, PermissionError):
    """A gated or private repository refused us: no token, or one without access."""


class HubNotFoundError(PagodaError, LookupError):
    """A repository, revision or file named by the user does not exist on the Hub."""


class NotEnoughDiskError(PagodaError, OSError):
    """A download would not fit in the free space of its folder."""


class ChecksumMismatchError(PagodaError):
    """A downloaded file's SHA-256 differs from the one the Hub published; the file was deleted."""


class DownloadCancelledError(PagodaError):
    """A download was cancelled; its partial file is kept so the next try resumes it."""


class MalformedGGUFError(ModelLoadError):
    """A GGUF file's header claims more than the file holds (a count, a length, a tensor's
    extent): damaged or crafted, refused before anything is allocated for it."""


class ChatTemplateError(PagodaError, ValueError):
    """A model's chat template cannot render a chat: a syntax error, an undefined name, its own
    refusal (raise_exception), or a limit on what a template may build or how long it may run."""


class OversizedDownloadError(PagodaError):
    """The Hub sent more bytes of a file than the size it published; the partial file was
    deleted rather than kept oversized."""


class StructuredOutputError(PagodaError, ValueError):
    """A request's constraint (JSON schema, regex, grammar, choice) cannot be compiled."""


class RequestFieldError(PagodaError, ValueError):
    """A field of a request breaks one of its rules (pagoda/engine/requests/): `field` names it
    as the request does (tool_choice, tools[2].function.name), the message says what is wrong
    and what to give instead."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ImageInputError(PagodaError, ValueError):
    """An image handed to the engine cannot be used: not a data URL Pagoda reads, a type it does
    not take, larger than its bounds, or not a whole image of the type it claims."""
