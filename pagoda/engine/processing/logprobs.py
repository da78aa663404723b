"""The runner's logprobs (token ids and numbers) as the engine hands them back: each token
with its text and bytes."""

from __future__ import annotations

from pagoda.engine.outputs import Logprob, TokenLogprobs
from pagoda.engine.structured_output.vocabulary import Vocabulary
from pagoda.engine.worker.logprobs import SampledLogprobs


def token_logprobs(vocabulary: Vocabulary, sampled: SampledLogprobs) -> TokenLogprobs:
    top = tuple(logprob(vocabulary, t, v)
                for t, v in zip(sampled.top_ids, sampled.top_logprobs, strict=True))
    return TokenLogprobs(logprob(vocabulary, sampled.token_id, sampled.logprob), sampled.rank,
                         top)


def logprob(vocabulary: Vocabulary, token_id: int, value: float) -> Logprob:
    raw = vocabulary.token_bytes(token_id)
    return Logprob(token_id, raw.decode("utf-8", errors="replace"), raw, value)
