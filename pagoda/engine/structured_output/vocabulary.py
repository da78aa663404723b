"""The model's vocabulary as bytes, built once from its tokenizer: what grammars are compiled
against and what a token's log-probability is reported as."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import xgrammar as xgr


class Vocabulary:
    """xgrammar's view of the tokenizer (each token's exact bytes, which tokens stop), made at
    first use (about 0.1 s) on whichever thread needs it first."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._info: xgr.TokenizerInfo | None = None
        self._bytes: list[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def info(self) -> xgr.TokenizerInfo:
        with self._lock:
            if self._info is None:
                self._info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size,
                    stop_token_ids=self.stop_token_ids)
            return self._info

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for; b"" for an id past the tokenizer's own vocabulary."""
        if self._bytes is None:
            decoded = self.info.decoded_vocab
            self._bytes = [bytes(b) for b in decoded]
        return self._bytes[token_id] if 0 <= token_id < len(self._bytes) else b""
