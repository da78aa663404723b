"""Token logprobs in the API's two shapes: the chat API's `logprobs.content` entries and the
legacy completions API's parallel lists."""

from __future__ import annotations

from pagoda.engine.outputs import Logprob, TokenLogprobs


def chat_logprobs(entries: list[TokenLogprobs] | None) -> dict | None:
    """A choice's (or a chunk's) `logprobs`: {"content": [...], "refusal": None}."""
    if entries is None:
        return None
    return {"content": [{**_chat_token(e.chosen),
                         "top_logprobs": [_chat_token(t) for t in e.top]} for e in entries],
            "refusal": None}


def _chat_token(logprob: Logprob) -> dict:
    return {"token": logprob.token, "logprob": logprob.logprob,
            "bytes": list(logprob.token_bytes)}


def completion_logprobs(entries: list[TokenLogprobs | None] | None, text_offset: int = 0,
                        first_token: str = "") -> dict | None:
    """The legacy `logprobs`: tokens, token_logprobs, top_logprobs (token -> logprob) and
    text_offset (where each token starts in the choice's text, counted from `text_offset`).
    A None entry is an echoed prompt's first token (`first_token`), which nothing predicts."""
    if entries is None:
        return None
    tokens = [first_token if e is None else e.chosen.token for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {"tokens": tokens,
            "token_logprobs": [None if e is None else e.chosen.logprob for e in entries],
            "top_logprobs": [None if e is None else {t.token: t.logprob for t in e.top}
                             for e in entries],
            "text_offset": offsets}
