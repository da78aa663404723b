"""Watching a ChatTokenizer's threads: which ones encode, and a long text held mid-encode.

Shared by the ChatTokenizer's own tests and the server's, which reach the same tokenizer through
a served model."""

from __future__ import annotations

import threading

import pytest

from pagoda.engine.text.chat_tokenizer import ChatTokenizer

LONG_TEXT_THREAD = "pagoda-tokenize-long"


def note_encoding_threads(chat_tokenizer: ChatTokenizer,
                          monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that encode from now on."""
    threads: list[str] = []
    encode = chat_tokenizer._call

    def noting_thread(work, tokenizer):
        threads.append(threading.current_thread().name)
        return encode(work, tokenizer)

    monkeypatch.setattr(chat_tokenizer, "_call", noting_thread)
    return threads


def hold_long_texts(chat_tokenizer: ChatTokenizer, monkeypatch: pytest.MonkeyPatch,
                    timeout_s: float) -> tuple[threading.Event, threading.Event]:
    """(entered, release): a long text's encoding sets `entered`, then waits for `release` (at
    most timeout_s) before it encodes; short texts are encoded as ever."""
    entered, release = threading.Event(), threading.Event()
    encode = chat_tokenizer._call

    def holding_long_texts(work, tokenizer):
        if threading.current_thread().name.startswith(LONG_TEXT_THREAD):
            entered.set()
            release.wait(timeout_s)
        return encode(work, tokenizer)

    monkeypatch.setattr(chat_tokenizer, "_call", holding_long_texts)
    return entered, release
