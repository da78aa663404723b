"""The app's backends: the seam (ChatBackend), the data it passes and the errors it raises.

The backends themselves are imported from their modules: pagoda.app.backends.chat.local (the engine in
this process) and pagoda.app.backends.remote.openai_remote (an OpenAI-compatible server), so that using one
never loads the other's dependencies (torch, httpx).
"""

from pagoda.app.backends.errors import (
    BackendError,
    BackendNotAnsweringError,
    BackendStoppedError,
    BackendUnreachableError,
    ConnectionDroppedError,
    ImagesRefusedError,
    InvalidAddressError,
    InvalidRequestError,
    MalformedStreamError,
    ModelLoadingError,
    ModelNotFoundError,
    PromptTooLongError,
    ServerError,
    UnauthorizedError,
)
from pagoda.app.backends.protocol import ChatBackend
from pagoda.engine.sampling.fields import SAMPLING_FIELDS, SamplingField, sampling_values
from pagoda.app.backends.types import (
    BackendStats,
    ChatImage,
    ChatMessage,
    FinishReason,
    ImageCost,
    ImageInput,
    PromptProgress,
    ReplyChunk,
    ReplyFormat,
    SamplingOptions,
    TokenCount,
    ToolCallRecord,
    ToolSpec,
    chat_cache_tag,
)

__all__ = [
    "BackendError",
    "BackendNotAnsweringError",
    "BackendStats",
    "BackendStoppedError",
    "BackendUnreachableError",
    "ChatBackend",
    "ChatImage",
    "ChatMessage",
    "ConnectionDroppedError",
    "FinishReason",
    "ImageCost",
    "ImageInput",
    "ImagesRefusedError",
    "InvalidAddressError",
    "InvalidRequestError",
    "MalformedStreamError",
    "ModelLoadingError",
    "ModelNotFoundError",
    "PromptProgress",
    "PromptTooLongError",
    "ReplyChunk",
    "ReplyFormat",
    "SAMPLING_FIELDS",
    "SamplingField",
    "SamplingOptions",
    "ServerError",
    "TokenCount",
    "ToolCallRecord",
    "ToolSpec",
    "UnauthorizedError",
    "chat_cache_tag",
    "sampling_values",
]
