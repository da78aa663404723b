"""What an OpenAI-compatible server says about itself: its models, their context, its kind."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from app.backends.endpoint import Endpoint
from app.backends.errors import BackendError, MalformedStreamError, ModelNotFoundError
from app.backends.openai_request import Flavor, flavor_of
from app.backends.types import ChatMessage

logger = logging.getLogger(__name__)
_NAMES_SHOWN = 5


@dataclass(slots=True, frozen=True)
class ServerInfo:
    """The model replies come from, the kind of server, and the model's context length (None
    when the server does not report it: vLLM, SGLang and Pagoda do)."""

    model: str
    flavor: Flavor
    max_model_len: int | None


async def fetch_server_info(endpoint: Endpoint, model: str | None) -> ServerInfo:
    """`model`, or the first one the server lists when None, as GET /models describes it. A
    server that lists no models can still be used with a model named."""
    try:
        payload = await endpoint.get_json("models")
    except ModelNotFoundError:
        if model is None:
            raise ModelNotFoundError(
                f"{endpoint.url} does not list its models (GET /models answered 404): give the "
                "model's name in the server settings.") from None
        return ServerInfo(model, "openai", None)
    entry = _choose(_entries(payload, endpoint.url), model, endpoint.url)
    return ServerInfo(entry["id"], flavor_of(entry.get("owned_by")),
                      _positive_int(entry.get("max_model_len")))


async def tokenize_chat(endpoint: Endpoint, model: str,
                        messages: Sequence[ChatMessage]) -> int | None:
    """The chat's prompt length from vLLM's POST /tokenize (which applies the model's chat
    template); None when the server cannot say."""
    url = endpoint.root_url("/tokenize")
    if url is None:
        return None
    body = {"model": model, "messages": [m.as_dict() for m in messages],
            "add_generation_prompt": True}
    try:
        payload = await endpoint.post_json(url, body)
    except BackendError as exc:
        logger.debug("%s could not count tokens: %s", endpoint.url, exc)
        return None
    return _positive_int(payload.get("count")) if isinstance(payload, dict) else None


def _entries(payload: object, url: str) -> list[dict]:
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or not all(
            isinstance(e, dict) and isinstance(e.get("id"), str) for e in data):
        raise MalformedStreamError(
            f"{url} answered GET /models with something that is not a list of models. Is the "
            "address that of an OpenAI-compatible API (it usually ends in /v1)?")
    return data


def _choose(entries: list[dict], model: str | None, url: str) -> dict:
    if not entries:
        raise ModelNotFoundError(f"{url} serves no model yet (it may still be loading one): try "
                                 "again in a moment.")
    if model is None:
        return entries[0]
    for entry in entries:
        if entry["id"] == model:
            return entry
    names = ", ".join(repr(e["id"]) for e in entries[:_NAMES_SHOWN])
    more = f" and {len(entries) - _NAMES_SHOWN} more" if len(entries) > _NAMES_SHOWN else ""
    raise ModelNotFoundError(f"{url} does not serve a model named {model!r}: it serves {names}"
                             f"{more}. Choose one of those.")


def _positive_int(value: object) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None
