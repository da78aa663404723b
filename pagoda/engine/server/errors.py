"""Errors in OpenAI's JSON shape, {"error": {"message", "type", "param", "code"}}, or on the
routes of Anthropic's Messages API in its shape, {"type": "error", "error": {"type", "message"}}."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagoda.engine.errors import (
    EngineDeadError,
    PromptTooLongError,
    RequestAbortedError,
    RequestFieldError,
)

_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}
# Anthropic's error types by status (its SDK picks the exception by the status).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
    429: "rate_limit_error", 503: "overloaded_error",
}
# The paths whose clients speak Anthropic's API (pagoda/engine/server/messages.py).
ANTHROPIC_PATHS = "/v1/messages"
_SAMPLING_FIELD = re.compile(r"SamplingParams\.(\w+)=")
_MESSAGES_FIELD = re.compile(r"^(messages\[\d+\](?:\.\w+)?)")


class APIError(Exception):
    """An error answered to the client, with the HTTP status and the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(self.status, "api_error"),
                                           "message": self.message}}

    def response(self, path: str = "") -> JSONResponse:
        """The error in the shape the clients of `path` read."""
        anthropic = path == ANTHROPIC_PATHS or path.startswith(ANTHROPIC_PATHS + "/")
        return JSONResponse(self.anthropic_body() if anthropic else self.body(),
                            status_code=self.status)


class NamedAPIError(APIError):
    """An error that already names the client's own request's fields (a Responses input part or a
    Messages block, read by the chat endpoint's code): `renamed_fields` leaves it as it is."""


def from_engine_error(exc: Exception, prompt_field: str) -> APIError:
    """The API error for what the engine raised about a request."""
    if isinstance(exc, EngineDeadError):
        return APIError(503, f"the engine is not running: {exc}", code="engine_dead")
    if isinstance(exc, RequestAbortedError):
        return APIError(503, f"{exc}: the server or its engine is stopping; retry once it is "
                             "back", code="request_aborted")
    if isinstance(exc, PromptTooLongError):
        return APIError(400, str(exc), param=prompt_field, code="context_length_exceeded")
    if isinstance(exc, RequestFieldError):
        return _broken_rule(exc)
    if isinstance(exc, ValueError):
        return APIError(400, str(exc), param=_param_of(str(exc), prompt_field))
    return APIError(500, f"{type(exc).__name__}: {exc}")


@contextmanager
def as_api_errors(prompt_field: str) -> Iterator[None]:
    """Turn what the engine raises about a request into the API's error for it."""
    try:
        yield
    except APIError:
        raise
    except Exception as exc:
        raise from_engine_error(exc, prompt_field) from exc


@contextmanager
def rule_errors() -> Iterator[None]:
    """A request rule broken inside (pagoda/engine/requests/) as the 400 naming its field."""
    try:
        yield
    except RequestFieldError as exc:
        raise _broken_rule(exc) from exc


def _broken_rule(exc: RequestFieldError) -> APIError:
    return APIError(400, str(exc), param=exc.field)


@contextmanager
def renamed_fields(names: tuple[tuple[re.Pattern, str], ...]) -> Iterator[None]:
    """Errors raised inside with the fields they name renamed (pattern -> replacement): a
    request that another endpoint's code checks (Responses and Messages become chat requests)
    is answered in its own fields' names."""
    try:
        yield
    except NamedAPIError:
        raise
    except APIError as exc:
        exc.message = _renamed(exc.message, names)
        exc.param = None if exc.param is None else _renamed(exc.param, names)
        raise


def _renamed(text: str, names: tuple[tuple[re.Pattern, str], ...]) -> str:
    for pattern, name in names:
        text = pattern.sub(name, text)
    return text


def _param_of(message: str, prompt_field: str) -> str | None:
    if match := _SAMPLING_FIELD.search(message):
        return match.group(1)
    if match := _MESSAGES_FIELD.match(message):
        return match.group(1)
    if "prompt" in message:
        return prompt_field
    return None


def validation_error(exc: RequestValidationError) -> APIError:
    """Pydantic's first complaint, with the path of the field (`messages[2].role`)."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "the request body is invalid")
    first = errors[0]
    location = [part for part in first.get("loc", ()) if part != "body"]
    path = _path(location)
    detail = first.get("msg", "invalid")
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {detail}")
    if not path:
        return APIError(400, f"the request body is invalid: {detail}")
    if first.get("type") == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {path} (this server "
                             "does not know it, so it would have no effect: leave it out)",
                        param=path)
    return APIError(400, f"{path}: {detail}", param=path)


def _path(location: list) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in {"str", "int", "float", "bool", "list[int]", "list[str]", "list[ContentPart]",
                      "list[list[int]]", "ContentPart"} or "[" in str(part):
            break  # the union member pydantic tried, not a field
        else:
            path += f".{part}" if path else str(part)
    return path


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's "error parsing the body"
            return APIError(400, "the request body nests its arrays and objects too deep to "
                                 "be read: send JSON of ordinary depth").response(request.url.path)
        return APIError(exc.status_code, str(exc.detail)).response(request.url.path)
