"""What the server serves: the current model, looked up per request so a model swap shows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.protocol import ChatBackend


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One loaded model behind the API. `name` is its id in /v1/models and in requests."""

    name: str
    backend: ChatBackend
    max_model_len: int
    owned_by: str = "pagoda"


# Returns the model being served now, or None while one is loading (requests get 503).
ModelSource = Callable[[], ServedModel | None]
