"""What an OpenAI-compatible server says about itself: its models, their context, its kind."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pagoda.app.backends.errors import BackendError, MalformedStreamError, ModelNotFoundError
from pagoda.app.backends.remote.endpoint import Endpoint
from pagoda.app.backends.remote.openai_request import Flavor, flavor_of
from pagoda.app.backends.types import ChatMessage, ToolSpec

logger = logging.getLogger(__name__)
_NAMES_SHOWN = 5


@dataclass(slots=True, frozen=True)
class ServerInfo:
    """The model replies come from, the kind of server, and the model's context length (None
    when the server does not report it: vLLM, SGLang, Pagoda and current llama.cpp do)."""

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
    flavor = flavor_of(entry.get("owned_by"))
    context = _positive_int(entry.get("max_model_len"))
    if context is None and flavor == "llama.cpp":
        context = await _llama_cpp_context(endpoint, entry)
    return ServerInfo(entry["id"], flavor, context)


async def _llama_cpp_context(endpoint: Endpoint, entry: dict) -> int | None:
    """The context one request may fill on llama.cpp's server. Its GET /props tells a slot's
    (`default_generation_settings.n_ctx`; `-np 4 -c 8192` gives each slot 2048), some builds
    only the whole context (`n_ctx`); /v1/models has the whole one in `meta.n_ctx`. Never
    `n_ctx_train`: that is what the model was trained on, not what the server runs with."""
    props = await _props(endpoint)
    settings = props.get("default_generation_settings")
    meta = entry.get("meta")
    for value in (settings.get("n_ctx") if isinstance(settings, dict) else None,
                  props.get("n_ctx"), meta.get("n_ctx") if isinstance(meta, dict) else None):
        if (n_ctx := _positive_int(value)) is not None:
            return n_ctx
    return None


async def _props(endpoint: Endpoint) -> dict:
    """llama.cpp's GET /props (beside /v1), or {} when the server has none to give."""
    url = endpoint.root_url("/props")
    if url is None:
        return {}
    try:
        payload = await endpoint.get_json(url)
    except BackendError as exc:
        logger.debug("%s has no /props: %s", endpoint.url, exc)
        return {}
    return payload if isinstance(payload, dict) else {}


async def tokenize_chat(endpoint: Endpoint, model: str, messages: Sequence[ChatMessage],
                        tools: Sequence[ToolSpec] = ()) -> int | None:
    """The chat's prompt length from vLLM's POST /tokenize (which applies the model's chat
    template); None when the server cannot say."""
    url = endpoint.root_url("/tokenize")
    if url is None:
        return None
    body = {"model": model, "messages": [m.as_dict() for m in messages],
            "add_generation_prompt": True}
    if tools:
        body["tools"] = [tool.as_dict() for tool in tools]
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
