"""A GGUF file's metadata keys without a file: what a family's config_from_gguf reads
(engine.models.gguf_config.GGUFSettings), for tests of how a family reads each key."""

from __future__ import annotations


class GGUFKeys:
    """The keys of an `architecture` file whose token table is `embedding` (vocab, hidden)."""

    def __init__(self, architecture: str, metadata: dict, embedding: tuple[int, int] = (100, 64)):
        self.architecture = architecture
        self._metadata = metadata
        self._embedding = embedding

    def metadata(self, key: str) -> object:
        return self._metadata.get(key)

    def tensor_dims(self, name: str) -> tuple[int, ...] | None:
        return self._embedding if name == "token_embd.weight" else None

    def small_vector(self, name: str, length: int) -> list[float] | None:
        return None
