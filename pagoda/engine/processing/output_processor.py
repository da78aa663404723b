"""A step's sampled tokens into RequestOutputs (vLLM's OutputProcessor): each live request's
detokenizer and the logprobs it asked for so far, the text its new tokens add, and a stop
string that ends it at the token completing it, even inside a run of kept drafts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pagoda.engine.core.scheduler import Scheduler, SchedulerOutput
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.outputs import CompletionOutput, PromptProgress, RequestOutput, TokenLogprobs
from pagoda.engine.processing.logprobs import token_logprobs
from pagoda.engine.structured_output.vocabulary import Vocabulary
from pagoda.engine.text.detokenizer import IncrementalDetokenizer
from pagoda.engine.worker.logprobs import SampledLogprobs
from pagoda.engine.worker.model_runner import RunnerOutput
from pagoda.engine.worker.pooler import pooled_vector


@dataclass(slots=True)
class RequestState:
    """A live request as its outputs need it: its sequence, its detokenizer and, where it
    asked for them, its tokens' logprobs so far and its prompt's (by position; None until
    scored)."""

    seq: Sequence
    detokenizer: IncrementalDetokenizer
    logprobs: list[TokenLogprobs] | None
    prompt_logprobs: list[TokenLogprobs | None] | None


class OutputProcessor:
    """Keeps each live request's state from `add_request` to its final output. scheduler: a
    stop string ends its request through it (`Scheduler.finish`), and the sequences it
    finished without new tokens still get their final output."""

    def __init__(self, tokenizer: Any, vocabulary: Vocabulary, eos_token_ids: frozenset[int],
                 scheduler: Scheduler) -> None:
        self._tokenizer = tokenizer
        self._vocabulary = vocabulary
        self._eos_token_ids = eos_token_ids
        self._scheduler = scheduler
        self._states: dict[str, RequestState] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    def has_unfinished_requests(self) -> bool:
        return bool(self._states)

    def add_request(self, seq: Sequence) -> None:
        params = seq.params
        detokenizer = IncrementalDetokenizer(self._tokenizer, seq.prompt_token_ids, params.stop,
                                             params.skip_special_tokens, self._eos_token_ids,
                                             params.min_tokens)
        logprobs = [] if params.logprobs is not None else None
        prompt_logprobs = ([None] * seq.num_prompt_tokens
                           if params.prompt_logprobs is not None else None)
        self._states[seq.request_id] = RequestState(seq, detokenizer, logprobs, prompt_logprobs)

    def sequence(self, request_id: str) -> Sequence | None:
        state = self._states.get(request_id)
        return None if state is None else state.seq

    def final_output(self, request_id: str) -> RequestOutput:
        """The output of a request ended outside a step's tokens (aborted, or its step
        failed), which is then forgotten."""
        out = self._output(self._states[request_id], [])
        del self._states[request_id]
        return out

    def process_outputs(self, sched: SchedulerOutput, advanced: list[tuple[Sequence, int]],
                        result: RunnerOutput | None) -> list[RequestOutput]:
        """The step's outputs: each advanced sequence's new tokens (their text, and logprobs
        where asked), each sequence finished without new ones, then each prompt read part
        way. advanced: (sequence, new tokens) from `Scheduler.update_from_output`; result:
        the runner's, None when the step ran nothing."""
        logprobs: dict[str, list[SampledLogprobs]] = {}
        if result is not None:
            logprobs = {item.seq.request_id: entries
                        for item, entries in zip(sched.scheduled, result.logprobs, strict=True)
                        if entries is not None}
            self._record_prompt_logprobs(sched, result.prompt_logprobs)
        return self._token_outputs(advanced, logprobs) + self._progress_outputs(sched)

    def _token_outputs(self, advanced: list[tuple[Sequence, int]],
                       logprobs: dict[str, list[SampledLogprobs]]) -> list[RequestOutput]:
        outputs = []
        for seq, num_new in advanced:
            outputs.append(self._output(self._states[seq.request_id],
                                        seq.output_token_ids[-num_new:],
                                        logprobs.get(seq.request_id)))
        reported = {o.request_id for o in outputs}
        for seq in self._scheduler.take_finished():
            state = self._states.get(seq.request_id)
            # By identity: an aborted request's id may already name a new request.
            if seq.request_id not in reported and state is not None and state.seq is seq:
                outputs.append(self._output(state, []))
        for out in outputs:
            if out.finished:
                self._states.pop(out.request_id, None)
        return outputs

    def _progress_outputs(self, sched: SchedulerOutput) -> list[RequestOutput]:
        """An output without tokens for each prompt this step read a chunk of but not to its end
        (it sampled nothing yet), saying how much of it is read. A sequence recomputed after
        preemption has output already and reports nothing: its reader is past the prompt."""
        outputs = []
        now = time.monotonic()
        for item in sched.scheduled:
            seq = item.seq
            if seq.num_output_tokens or seq.is_finished:  # decoding (most rows), or done
                continue
            state = self._states.get(seq.request_id)
            if state is None or state.seq is not seq:
                continue
            out = self._output(state, [])
            started = seq.metrics.first_scheduled_time or seq.metrics.arrival_time
            out.prompt_progress = PromptProgress(seq.num_prompt_tokens, seq.num_computed_tokens,
                                                 seq.num_cached_tokens, now - started)
            outputs.append(out)
        return outputs

    def _output(self, state: RequestState, new_tokens: list[int],
                new_logprobs: list[SampledLogprobs] | None = None) -> RequestOutput:
        seq, detokenizer = state.seq, state.detokenizer
        if new_tokens and seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = time.monotonic()
        delta_text, new_tokens = self._detokenize(seq, detokenizer, new_tokens)
        completion = CompletionOutput(0, detokenizer.text, list(seq.output_token_ids),
                                      seq.finish_reason, delta_text, list(new_tokens),
                                      stop_string=detokenizer.stop_string)
        so_far = state.logprobs
        if so_far is not None:
            delta = [token_logprobs(self._vocabulary, x)
                     for x in (new_logprobs or [])[:len(new_tokens)]]
            so_far.extend(delta)
            completion.logprobs, completion.delta_logprobs = list(so_far), delta
        prompt_logprobs = state.prompt_logprobs
        embedding = (pooled_vector(seq) if seq.is_pooling and seq.finish_reason == "stop"
                     else None)
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids, [completion],
                             seq.is_finished, seq.num_cached_tokens, seq.metrics,
                             prompt_logprobs=None if prompt_logprobs is None or not
                             seq.num_output_tokens else list(prompt_logprobs),
                             embedding=embedding)

    def _record_prompt_logprobs(
            self, sched: SchedulerOutput,
            scored: list[tuple[int, list[SampledLogprobs]] | None] | None) -> None:
        """Each scored prompt token's logprobs, by position (a prompt read again after a
        preemption writes the same ones again)."""
        if scored is None:
            return
        for item, entry in zip(sched.scheduled, scored, strict=True):
            state = self._states.get(item.seq.request_id)
            kept = None if state is None else state.prompt_logprobs
            if entry is None or kept is None:
                continue
            first, entries = entry
            kept[first:first + len(entries)] = [token_logprobs(self._vocabulary, e)
                                                for e in entries]

    def _detokenize(self, seq: Sequence, detokenizer: IncrementalDetokenizer,
                    new_tokens: list[int]) -> tuple[str, list[int]]:
        """The new text and the new tokens that count, fed one token at a time as without
        speculation: a stop string completed inside a run of kept drafts ends the output at the
        token that completed it, and the tokens after it are dropped."""
        if len(new_tokens) <= 1:
            update = detokenizer.update(new_tokens, finished=seq.is_finished)
            if update.stop_string is not None:
                self._scheduler.finish(seq, "stop")
            return update.delta_text, new_tokens
        deltas = []
        for n, token in enumerate(new_tokens, 1):
            update = detokenizer.update([token], finished=seq.is_finished and n == len(new_tokens))
            deltas.append(update.delta_text)
            if update.stop_string is not None:
                self._stop_at_string(seq, seq.num_output_tokens - len(new_tokens) + n)
                return "".join(deltas), new_tokens[:n]
        return "".join(deltas), new_tokens

    def _stop_at_string(self, seq: Sequence, num_output_tokens: int) -> None:
        if num_output_tokens < seq.num_output_tokens:
            seq.truncate_output(num_output_tokens)
            # It may have ended later for another reason (EOS, max_tokens) in the dropped part.
            if seq.is_finished:
                seq.finish_reason = "stop"
        self._scheduler.finish(seq, "stop")
