"""Exceptions a user can cause. Each message names the thing at fault and how to fix it."""


class PagodaError(Exception):
    """Base class for errors Pagoda reports to users."""


class ModelLoadError(PagodaError):
    """A model source could not be turned into config, tokenizer and weights."""


class PromptTooLongError(PagodaError, ValueError):
    """A prompt does not fit the model's context window."""


class EngineDeadError(PagodaError, RuntimeError):
    """The engine thread has stopped; no new requests can be served."""


class InvalidTextError(PagodaError, ValueError):
    """Text handed to the engine is not valid Unicode (a lone surrogate)."""
