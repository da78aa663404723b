"""What the server serves: the current model, looked up per request so a model swap shows."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pagoda.engine.llm_engine import EngineStats
from pagoda.engine.multimodal.images import DecodedImage
from pagoda.engine.multimodal.placeholders import ImagePrompt
from pagoda.engine.outputs import RequestOutput
from pagoda.engine.server.remote_images import RemoteImages
from pagoda.engine.sampling.params import PoolingParams, SamplingParams
from pagoda.engine.text.chat_template import Message
from pagoda.engine.text.chat_tokenizer import ChatTokenizer


@runtime_checkable
class EngineBackend(Protocol):
    """What the server asks of the engine behind it: AsyncEngine, in this process."""

    chat_tokenizer: ChatTokenizer  # every prompt is encoded with it, off the server's loop
    chat_template: str | None  # the model's, to choose how its replies are read
    hidden_size: int  # the width of the vectors `embed` makes
    image_prompt: ImagePrompt | None  # how a chat's images enter its prompt; None: text only

    def token_text(self, token_ids: list[int]) -> str:
        """The text of tokens, safe on the server's thread."""

    def stream(self, prompt: str | list[int] | Sequence[Message],
               params: SamplingParams | None = None,
               request_id: str | None = None,
               images: Sequence[DecodedImage] = ()) -> AsyncIterator[RequestOutput]: ...

    def abort(self, request_id: str) -> None: ...

    async def embed(self, prompts: Sequence[list[int]], params: PoolingParams | None = None,
                    request_id: str | None = None) -> list[list[float]]:
        """One vector per prompt, made by the engine (its requests f"{request_id}-{i}")."""

    async def compile_grammar(self, params: SamplingParams) -> object | None:
        """params.structured_outputs compiled (cached for the stream that follows);
        StructuredOutputError naming what is wrong with it."""

    def stats(self) -> EngineStats: ...

    def check_health(self) -> None:
        """Raise (EngineDeadError) when the engine can serve no more requests."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One loaded model behind the API. `name` is its id in /v1/models and in requests."""

    name: str
    backend: EngineBackend
    max_model_len: int
    owned_by: str = "pagoda"
    created: int = 0  # its file's time (Unix seconds), as /v1/models shows it
    # --force-tool-call: a request offering tools under "auto" must call one when the chat asks
    # something new (pagoda/engine/requests/tools.py, forced_on_new_task).
    force_tool_call: bool = False
    # --allow-remote-images and its kin: whether an image part's http(s) URL is fetched, from
    # which addresses and for how long (pagoda/engine/server/remote_images.py).
    remote_images: RemoteImages = RemoteImages()

    def card(self) -> dict:
        """Its entry in GET /v1/models, and the body of GET /v1/models/{id}."""
        return {"id": self.name, "object": "model", "created": self.created,
                "owned_by": self.owned_by, "max_model_len": self.max_model_len}


# Returns the model being served now, or None while one is loading (requests get 503).
ModelSource = Callable[[], ServedModel | None]
