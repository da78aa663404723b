"""A server's refusals and the network's failures, as the BackendErrors the tab shows."""

from __future__ import annotations

import json
import re

import httpx

from pagoda.app.backends.errors import (
    BackendError,
    BackendNotAnsweringError,
    BackendUnreachableError,
    ConnectionDroppedError,
    ImagesRefusedError,
    InvalidRequestError,
    ModelNotFoundError,
    PromptTooLongError,
    ServerError,
    UnauthorizedError,
    clause,
)

_MAX_MESSAGE_CHARS = 300
# vLLM and OpenAI say "maximum context length", llama.cpp "exceeds the available context size".
_CONTEXT = re.compile(r"context (length|size|window)|too long|n_ctx", re.IGNORECASE)
_TIMEOUTS = (TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)
# The fields of a chat's settings that a server may not take (no tool parser, no --jinja, no
# structured output), as its error's `param` or its words name them, and what to do then.
_TOOLS_ADVICE = ("The server or its model may not take tools (vLLM needs "
                 "--enable-auto-tool-choice and --tool-call-parser, llama.cpp --jinja): turn "
                 "this chat's tools off, or use another server")
# A refusal of an image part: vLLM, llama.cpp and Pagoda name the part or say "image",
# "vision", "multimodal" or "text only".
_IMAGES = re.compile(r"image|vision|multimodal|multi-modal|text[ -]only|mmproj", re.IGNORECASE)
_IMAGES_ADVICE = ("Its model may not take images: ask again in a message without them, or use "
                  "a server whose model sees images")
_FORMAT_ADVICE = ("The server may not follow a reply format, or not this schema: change this "
                  "chat's reply format or turn it off")
_FIELDS = {
    "tool_choice": (re.compile(r"tool[_ ]choice", re.IGNORECASE), _TOOLS_ADVICE),
    "tools": (re.compile(r"\btools?\b|function call", re.IGNORECASE), _TOOLS_ADVICE),
    "response_format": (re.compile(r"response_format|json_schema|json_object|structured "
                                   r"output|guided", re.IGNORECASE), _FORMAT_ADVICE),
}


def server_message(body: bytes | str) -> tuple[str, str | None]:
    """The server's own words about an error and its code, from the body's usual shapes:
    OpenAI's {"error": {"message", "code"}}, vLLM's and SGLang's {"object": "error", "message"},
    FastAPI's {"detail"}, Ollama's {"error": "..."}, else the text itself."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        payload = json.loads(text)
    except ValueError:
        return _shorten(text), None
    if not isinstance(payload, dict):
        return _shorten(text), None
    error = payload.get("error")
    if isinstance(error, dict):
        return _shorten(str(error.get("message", ""))), _code(error.get("code"))
    if isinstance(error, str):
        return _shorten(error), None
    for key in ("message", "detail"):
        if isinstance(payload.get(key), str):
            return _shorten(payload[key]), _code(payload.get("code"))
    return _shorten(text), None


def error_for_status(status: int, body: bytes | str, url: str) -> BackendError:
    """The error for a request the server answered with a status other than 200."""
    message, code = server_message(body)
    said = f": {message}" if message else ""
    if status in (401, 403):
        return UnauthorizedError(
            f"{url} refused the API key (HTTP {status}{said}). Enter the key the server was "
            "started with (for example vllm serve --api-key) in the server settings.")
    if status == 404:
        return ModelNotFoundError(
            f"{url} answered 404 Not Found{said}. Check the model name (GET {url}/models lists "
            "the served ones) and that the address is the API's: it usually ends in /v1.")
    if status in (400, 413, 422):
        return _refusal(status, message, code, url, _param(body))
    if status == 429:
        return ServerError(f"{url} is too busy to take the request (HTTP 429{said}). Try again "
                           "in a moment.", status=status)
    if status >= 500:
        return ServerError(f"{url} failed the request (HTTP {status}){said}. Try again; if it "
                           "keeps failing, look at the server's log.", status=status)
    return ServerError(f"{url} answered HTTP {status}{said}.", status=status)


def error_for_transport(exc: Exception, url: str, *, connect_timeout: float,
                        response_timeout: float, answered: bool) -> BackendError:
    """The error for a request the network failed; `answered`: the reply had begun."""
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return BackendUnreachableError(
            f"Could not connect to {url}: no answer within {connect_timeout:g} s. Check the "
            "address, and that the server runs and this computer can reach it (firewall, VPN).")
    if isinstance(exc, httpx.ConnectError):
        return BackendUnreachableError(
            f"Could not connect to {url} ({reason}). Check that the server is running and that "
            "the address and port are right.")
    if isinstance(exc, _TIMEOUTS):
        return BackendNotAnsweringError(
            f"{url} took the connection but sent no answer within {response_timeout:g} s. The "
            "server may be overloaded or still loading its model: try again later, or look at "
            "its log.")
    if answered:
        return dropped_mid_reply(url, reason)
    return ConnectionDroppedError(
        f"{url} closed the connection without answering ({reason}). Check that the address is "
        "an OpenAI-compatible API, and look at the server's log.")


def dropped_mid_reply(url: str, reason: str) -> ConnectionDroppedError:
    return ConnectionDroppedError(
        f"The connection to {url} was lost in the middle of the reply ({reason}). What arrived "
        "is kept; check the server, then regenerate.")


def _refusal(status: int, message: str, code: str | None, url: str,
             param: str | None) -> InvalidRequestError:
    said = f": {message}" if message else ""
    if code == "context_length_exceeded" or _CONTEXT.search(message):
        return PromptTooLongError(
            f"The chat is too long for the model at {url}{said}. Start a new chat, or shorten "
            "the longest messages.")
    if _IMAGES.search(message):
        return ImagesRefusedError(f"{url} refused this chat's images (HTTP {status}{said}). "
                                  f"{_IMAGES_ADVICE}.")
    field = _refused_field(message, param)
    if field is not None:
        return InvalidRequestError(f"{url} refused this chat's {field} (HTTP {status}{said}). "
                                   f"{_FIELDS[field][1]}.")
    return InvalidRequestError(
        f"{url} refused the request (HTTP {status}){said}. Check this chat's sampling "
        "settings.")


def _refused_field(message: str, param: str | None) -> str | None:
    """Which of _FIELDS the server refused: the one its `param` names (OpenAI's shape), else
    the one its words name; None for any other field."""
    if param is not None:
        name = re.match(r"\w*", param).group()
        return name if name in _FIELDS else None
    return next((name for name, (words, _) in _FIELDS.items() if words.search(message)), None)


def _param(body: bytes | str) -> str | None:
    """The field OpenAI's error shape names ({"error": {"param"}}), None where it names none."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    param = error.get("param") if isinstance(error, dict) else None
    return param if isinstance(param, str) and param else None


def _code(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _shorten(text: str) -> str:
    """The server's words, on one line and at most _MAX_MESSAGE_CHARS, to quote in a sentence."""
    text = clause(" ".join(text.split()))
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "…"
