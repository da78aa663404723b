"""The synchronous engine: add requests, step, get outputs. One thread drives it."""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from dataclasses import dataclass
from collections.abc import Sequence as Seq
from pathlib import Path

import torch
from transformers import GenerationConfig

from pagoda.engine.config import EngineConfig, SchedulerConfig
from pagoda.engine.core.kv_cache_manager import KVCacheManager
from pagoda.engine.core.scheduler import Scheduler, SchedulerOutput
from pagoda.engine.core.image_spans import ImageSpan
from pagoda.engine.core.sequence import Sequence
from pagoda.engine.core.checkpoint_store import CheckpointStore
from pagoda.engine.core.state_pool import StatePool
from pagoda.engine.disk_cache.block_io import group_block_ios
from pagoda.engine.disk_cache.state_io import RecurrentStateIO
from pagoda.engine.disk_cache.store import DiskCacheStats, check_cache_tag
from pagoda.engine.disk_cache.tier import DiskPrefixCache, model_fingerprint, open_disk_prefix_cache
from pagoda.engine.errors import ImageInputError, PromptTooLongError
from pagoda.engine.loading.loader import LoadedModel, load_model
from pagoda.engine.loading.model_info import check_model_fits
from pagoda.engine.multimodal.image_processing import image_processor
from pagoda.engine.multimodal.images import DecodedImage
from pagoda.engine.multimodal.placeholders import ImagePrompt, image_spans, tower_image_prompt
from pagoda.engine.outputs import RequestOutput
from pagoda.engine.parsers.reasoning_markers import reasoning_markers
from pagoda.engine.processing.output_processor import OutputProcessor
from pagoda.engine.sampling.params import PoolingParams, SamplingParams
from pagoda.engine.sampling.reasoning_budget import ReasoningBudget
from pagoda.engine.spec_decode.draft_sources import (
    MIN_BLOCK_CHECKS,
    DraftSources,
    ModelDrafts,
    drafts_that_pay,
)
from pagoda.engine.spec_decode.ngram_proposer import NgramProposer
from pagoda.engine.spec_decode.step_cost import StepCost
from pagoda.engine.structured_output.compiler import StructuredOutputCompiler
from pagoda.engine.structured_output.matcher import GrammarState
from pagoda.engine.structured_output.vocabulary import Vocabulary
from pagoda.engine.text.unicode import check_encodable
from pagoda.engine.worker.calibration import calibrate_step_cost
from pagoda.engine.worker.logits_controls import bad_words_token_ids
from pagoda.engine.worker.model_runner import ModelRunner, RunnerOutput

logger = logging.getLogger(__name__)

_THROUGHPUT_WINDOW_S = 10.0
# Enough of a prompt's end to see whether it opens the reasoning ("<think>\n").
_PROMPT_TAIL_TOKENS = 8


@dataclass(slots=True, frozen=True)
class EngineStats:
    """An immutable snapshot, safe to hand to another thread.

    spec_draft_tokens / spec_accepted_tokens: tokens proposed by speculative decoding and those the
    model kept; spec_acceptance_rate is their ratio, None while speculation is off or has proposed
    nothing yet. spec_status says whether the recent steps that had drafts to offer verified
    them ("drafts off: 13% accepted": a trend over many steps, which does not flip with each
    step's own decision), spec_reason how often and why the latest did or did not ("..., and a
    2-row step costs 1.33x a 1-row step here"); both None until such a step.
    """

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_kv_blocks: int
    prefix_cache_hit_rate: float
    generation_tokens_per_s: float
    num_preemptions: int
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_acceptance_rate: float | None = None
    disk_cache: DiskCacheStats | None = None  # the prefix cache's disk tier, when it has one
    spec_status: str | None = None
    spec_reason: str | None = None


class LLMEngine:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None,
                 loaded: LoadedModel | None = None, release_weights: bool | None = None) -> None:
        """release_weights: hand loaded.weights over to the model, emptying it as layers are
        built (the default when the engine loads the model itself); a caller that builds more
        engines from one LoadedModel keeps it."""
        self.config = config or EngineConfig()
        torch.set_num_threads(self.config.resolved_num_threads())
        if loaded is None:
            check_model_fits(model, self.config)
        self.loaded = loaded or load_model(model, self.config.dtype,
                                           quantization=self.config.quantization,
                                           mmproj=self.config.mmproj,
                                           mtp=self.config.num_speculative_tokens > 0)
        self.tokenizer = self.loaded.tokenizer
        release = loaded is None if release_weights is None else release_weights
        self.runner = ModelRunner(self.loaded, self.config, release)
        self.max_model_len = self.runner.max_model_len
        # The longest sequence one request can run here: the context allowed, within what the
        # KV cache's first group holds (its blocks are all kept: the full-attention layers;
        # windowed layers keep only their windows, so at the same memory that reaches further).
        self.usable_context_len = min(self.max_model_len, self._kv_cache_capacity())
        # The width of a pooling request's vector.
        self.hidden_size = self.runner.model.shape.hidden_size
        recurrent = self.runner.model.arch.has_recurrent_layers
        if recurrent:
            self._log_what_recurrent_layers_turn_off()
        # A hybrid's blocks are of use only with checkpoints of its states: none, no disk tier.
        keeps_disk = not recurrent or self.runner.num_checkpoint_slots > 0
        self.disk_cache = self._open_disk_cache() if keeps_disk else None
        self.kv_cache = KVCacheManager(self.runner.kv_cache_groups, self.config.block_size,
                                       self.config.enable_prefix_caching, self.disk_cache,
                                       recurrent=recurrent, checkpoints=self._checkpoint_store())
        proposer = _proposer(self.config, drafts_itself=self.runner.mtp_kv is not None)
        measure = proposer is not None and self.config.speculative_cost_model
        self.step_cost = self._calibrate() if measure else StepCost()
        # Each running sequence's slot in the recurrent layers' states, where there are any.
        self.state_pool = StatePool(self.runner.num_state_slots) if recurrent else None
        self.scheduler = Scheduler(
            SchedulerConfig(self.config.max_num_seqs, self.config.max_num_batched_tokens,
                            self.max_model_len, self.config.speculative_disable_by_batch_size),
            self.kv_cache, proposer, self.step_cost, self.state_pool)
        self.eos_token_ids = _eos_token_ids(self.loaded)
        self.vocabulary = Vocabulary(self.tokenizer, self.runner.vocab_size, self.eos_token_ids)
        # Thread-safe: AsyncEngine compiles on a thread of its own, LLM on the caller's.
        self.grammar_compiler = StructuredOutputCompiler(self.vocabulary)
        self.output_processor = OutputProcessor(self.tokenizer, self.vocabulary,
                                                self.eos_token_ids, self.scheduler)
        self._token_times: deque[tuple[float, int]] = deque()
        self._window_tokens = 0  # the sum of _token_times' counts
        self._num_preemptions = 0

    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | PoolingParams | None = None,
                    cache_tag: str | None = None, grammar: object | None = None,
                    images: Seq[DecodedImage] = ()) -> None:
        """params: SamplingParams for a reply, or PoolingParams to read the prompt into one
        vector (its final output's `embedding`; see PoolingParams).
        images: the prompt's images in order, each filling a run of the model's image token
        (pagoda.engine.multimodal.placeholders), for a model whose images Pagoda runs.
        cache_tag: a name for whatever this request belongs to (a chat); the blocks it uses
        on disk are listed under it, so pagoda.engine.disk_cache.store.forget_tag can remove them later.
        grammar: params.structured_outputs already compiled by `grammar_compiler` (off this
        thread); without it a constrained request is compiled here."""
        params = params or SamplingParams()
        if request_id in self.output_processor:
            raise ValueError(f"request_id {request_id!r} is already running")
        if cache_tag is not None:
            check_cache_tag(cache_tag)
        prompt_text = prompt if isinstance(prompt, str) else None
        if prompt_text is not None:
            check_encodable(prompt_text, "the prompt")
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        spans = self._image_spans(token_ids, images) if images else ()
        if isinstance(params, PoolingParams):
            seq = self._pooling_sequence(request_id, token_ids, params, prompt_text, cache_tag)
        else:
            seq = self._sampling_sequence(request_id, token_ids, params, prompt_text, cache_tag,
                                          grammar)
        seq.images = spans
        self.output_processor.add_request(seq)
        self.scheduler.add(seq)

    @functools.cached_property
    def image_prompt(self) -> ImagePrompt | None:
        """How a chat's image parts become the prompt's placeholders (made once); None for a
        model that takes text only."""
        tower = self.runner.image_tower
        if tower is None:
            return None
        return tower_image_prompt(tower, *self.tokenizer.convert_ids_to_tokens(
            [tower.start_token_id, tower.image_token_id, tower.end_token_id]))

    def _image_spans(self, token_ids: list[int], images: Seq[DecodedImage]
                     ) -> tuple[ImageSpan, ...]:
        tower = self.runner.image_tower
        if tower is None:
            raise ImageInputError("this model takes text only: it reads no images")
        if self.runner.model.ops.name == "triton":
            raise ImageInputError("images run on the CPU path only so far: this engine runs "
                                  "Triton kernels")
        return image_spans(token_ids, images, tower.image_token_id, image_processor(tower),
                           whole=tower.bidirectional)

    def _sampling_sequence(self, request_id: str, token_ids: list[int], params: SamplingParams,
                           prompt_text: str | None, cache_tag: str | None,
                           grammar: object | None) -> Sequence:
        self._validate_prompt(token_ids, reply_tokens=1)
        self._validate_token_ids(params)
        seq = Sequence(request_id, token_ids, params, self.eos_token_ids, prompt=prompt_text,
                       cache_tag=cache_tag)
        if params.structured_outputs is not None:
            seq.grammar = GrammarState(grammar or self.grammar_compiler.compile(
                params.structured_outputs))
        if params.bad_words:
            seq.bad_words_token_ids = bad_words_token_ids(self.tokenizer, params.bad_words)
        if params.thinking_token_budget is not None:
            seq.reasoning_budget = self._reasoning_budget(token_ids, params.thinking_token_budget)
        return seq

    def _reasoning_budget(self, prompt: list[int], budget: int) -> ReasoningBudget | None:
        """The reply's budget; None where the model's template has no reasoning (a reply
        without any keeps every budget)."""
        template = getattr(self.tokenizer, "chat_template", None)
        markers = reasoning_markers(template if isinstance(template, str) else None)
        if markers is None:
            return None
        tail = self.tokenizer.decode(prompt[-_PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        closing = markers.closing_ids(
            lambda text: self.tokenizer.encode(text, add_special_tokens=False))
        return ReasoningBudget(budget, markers, closing, opened=markers.opened_by(tail),
                               token_bytes=self.vocabulary.token_bytes)

    def _pooling_sequence(self, request_id: str, token_ids: list[int], params: PoolingParams,
                          prompt_text: str | None, cache_tag: str | None) -> Sequence:
        if cache_tag is not None:
            raise ValueError("a pooling request keeps no blocks in the prefix cache, so it "
                             "takes no cache_tag: leave it out")
        self._validate_prompt(token_ids, reply_tokens=0)
        return Sequence(request_id, token_ids, SamplingParams(), self.eos_token_ids,
                        prompt=prompt_text, pooling=params)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """End a request now and free its blocks; returns its final output if it was live."""
        seq = self.output_processor.sequence(request_id)
        if seq is None:
            return None
        self.scheduler.finish(seq, "abort")
        return self.output_processor.final_output(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        self._num_preemptions += len(sched.preempted)
        if not sched.is_empty:
            began = time.perf_counter()
            try:
                result = self.runner.execute(sched)
            except Exception as exc:  # a failed step fails its requests, never the engine
                logger.exception("engine step failed")
                return self._fail(sched, exc)
            seconds = time.perf_counter() - began
            self._observe_prefill(sched, seconds)
            self._observe_decode(sched, self._decode_seconds(seconds, result))
            advanced = self.scheduler.update_from_output(sched, result.sampled)
            if result.drafts is not None:
                self.scheduler.offer_drafts(sched, result.drafts)
                self._judge_the_model_drafter()
            self._record_tokens(sum(n for _, n in advanced))
            return self.output_processor.process_outputs(sched, advanced, result)
        return self.output_processor.process_outputs(sched, [], None)

    def close(self, timeout: float = 10.0) -> None:
        """Write what the disk tier still has queued; the engine can still step afterwards, but
        nothing more is saved. Idempotent."""
        if self.disk_cache is not None:
            self.disk_cache.close(timeout)

    def stats(self) -> EngineStats:
        kv = self.kv_cache.stats()
        spec, drafting = self.scheduler.proposer, self.scheduler.drafting
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), kv.usage,
                           kv.num_blocks, kv.prefix_hit_rate, self._recent_throughput(),
                           self._num_preemptions,
                           spec_draft_tokens=spec.num_draft_tokens if spec else 0,
                           spec_accepted_tokens=spec.num_accepted_tokens if spec else 0,
                           spec_acceptance_rate=spec.acceptance_rate if spec else None,
                           disk_cache=self.disk_cache.stats() if self.disk_cache else None,
                           spec_status=drafting.headline(),
                           spec_reason=drafting.reason())

    def _checkpoint_store(self) -> CheckpointStore | None:
        """Where the prefix cache keeps the recurrent layers' states at block boundaries: the
        runner's checkpoint slots, after the running sequences' (None without any)."""
        runner = self.runner
        if not runner.num_checkpoint_slots:
            return None
        first = runner.num_state_slots
        return CheckpointStore(range(first, first + runner.num_checkpoint_slots))

    def _log_what_recurrent_layers_turn_off(self) -> None:
        """A model with recurrent layers keeps their states for the prefix cache only at block
        boundaries (checkpoints, in memory and in the disk tier): what needs more is off, said
        once here. (Speculative decoding runs: a verifying step keeps the states after each
        draft, and the runner keeps those after the accepted ones.)"""
        c = self.config
        if c.enable_prefix_caching and not self.runner.num_checkpoint_slots:
            logger.info("%s has recurrent layers, whose states Pagoda keeps only at block "
                        "boundaries (checkpoints, in memory and on disk: the prefix cache "
                        "restarts there): the prefix cache and its disk tier (no room for "
                        "checkpoints of the states) off for this model",
                        self.runner.model.arch.family)

    def _open_disk_cache(self) -> DiskPrefixCache | None:
        """The prefix cache's disk tier, when config.disk_cache_dir names a folder, for this
        model made this way (see pagoda.engine.disk_cache.tier)."""
        c = self.config
        if c.disk_cache_dir is None or not c.enable_prefix_caching:
            return None
        shape = self.runner.model.shape
        settings = {"dtype": self.runner.dtype, "quantization": c.quantization,
                    "kernels": self.runner.model.ops.name, "device": self.runner.device.type,
                    "block_size": c.block_size, "layers": shape.num_layers,
                    "kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
                    "architecture": type(self.runner.model).__name__}
        if self.runner.kv_dtype != self.runner.dtype:
            # Only then: caches written before the KV dtype was a setting stay valid.
            settings["kv_cache_dtype"] = self.runner.kv_dtype
        tower = self.runner.image_tower
        if tower is not None and tower.dtype != self.runner.dtype:
            # Only then, as the KV dtype: an image's blocks hold what a tower of this dtype
            # made of it, and caches written before the tower had its own dtype stay valid.
            settings["vision_dtype"] = tower.dtype
        layout = self.runner.kv_layout
        caches, groups = self.runner.kv_caches, [layers for _, layers in layout]
        if self.runner.mtp_kv is not None:
            # The multi-token-prediction block's keys ride in the first group's blocks: saved
            # and read with them, so a hit from disk restores them as one from memory does
            # (its files are its own: the block's keys change the blocks' shape).
            caches, groups = [*caches, self.runner.mtp_kv], [(*groups[0], len(caches)),
                                                            *groups[1:]]
            settings["mtp_kv"] = list(self.runner.mtp_kv[0].shape[1:])
        ios = group_block_ios(caches, groups)
        if len(ios) > 1:
            # Only then, as the KV dtype: a model of one group keeps its files. Each group's
            # layers and block shape, so no file of another grouping is read as a group's part.
            settings["kv_groups"] = ";".join(
                f"window {window}: layers {list(layers)} {list(io.block_shape)}"
                for (window, layers), io in zip(layout, ios, strict=True))
        state_io = None
        if self.runner.recurrent_states:
            # Only then: a model of attention layers keeps its files. The states' shapes, so
            # that no checkpoint of another layout is read as this model's.
            state_io = RecurrentStateIO(self.runner.recurrent_states)
            settings["recurrent_states"] = state_io.layout()
        fingerprint = model_fingerprint(self.loaded.path, settings)
        return open_disk_prefix_cache(Path(c.disk_cache_dir), c.disk_cache_bytes, fingerprint,
                                      ios, state_io)

    def _validate_prompt(self, token_ids: list[int], reply_tokens: int) -> None:
        """reply_tokens: the room the prompt must leave (1 for a reply's first token, 0 for a
        pooling request, which is only read)."""
        if not token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.runner.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
        together = " (prompt and reply together)" if reply_tokens else ""
        if len(token_ids) + reply_tokens > self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(token_ids)} tokens but the model's context holds "
                f"{self.max_model_len}{together}: shorten the prompt")
        capacity = self._kv_cache_capacity()
        if len(token_ids) + reply_tokens > capacity:
            raise PromptTooLongError(
                f"the prompt has {len(token_ids)} tokens but the KV cache holds {capacity}: "
                f"raise EngineConfig.{self._kv_cache_setting()} or shorten the prompt")

    def _kv_cache_capacity(self) -> int:
        """The tokens one sequence can hold in the KV cache: its first group's blocks."""
        return self.runner.num_blocks * self.config.block_size

    def _kv_cache_setting(self) -> str:
        """The setting that sizes the KV cache here."""
        if self.config.num_kv_blocks is not None:
            return "num_kv_blocks"
        if self.config.device.startswith("cuda"):
            return "gpu_memory_utilization"
        return "kv_cache_memory"

    def _observe_prefill(self, sched: SchedulerOutput, seconds: float) -> None:
        """Tell the disk tier what computing prompt tokens costs here, from steps that are
        mostly prompt. On a GPU only a step that samples waits for its work (one that only reads
        a chunk returns before it is done), so only those are timed there."""
        if self.disk_cache is None:
            return
        if self.runner.device.type != "cpu" and not any(s.samples for s in sched.scheduled):
            return
        num_prompt = sum(s.num_new_tokens for s in sched.scheduled
                         if s.num_computed_tokens < s.seq.num_prompt_tokens)
        if num_prompt >= 4 * self.config.block_size:
            self.disk_cache.observe_prefill(sched.num_batched_tokens, seconds)

    def _calibrate(self) -> StepCost:
        """The step cost table's first figures (pagoda.engine.worker.calibration), before any
        request: a fraction of a second for the default model on a CPU."""
        return calibrate_step_cost(self.runner, self.config.num_speculative_tokens,
                                   self.config.max_num_batched_tokens)

    def _observe_decode(self, sched: SchedulerOutput, seconds: float) -> None:
        """Refine the step cost with a step of decodes only (each row one sequence's next
        token or a draft): its time by rows. Steps that read prompt chunks are not rows of
        the same cost."""
        if not self.step_cost.is_known:  # no speculation, or no cost model
            return
        for item in sched.scheduled:
            if not item.samples or item.num_computed_tokens < item.seq.num_tokens - 1:
                return
        self.step_cost.observe(sched.num_batched_tokens, seconds)

    def _decode_seconds(self, seconds: float, result: RunnerOutput) -> float:
        """A step's time as the step cost counts it: without the multi-token-prediction
        block's chained passes, whose number the engine chooses apart (_judge_the_model_drafter)."""
        return seconds - result.draft_seconds

    def _judge_the_model_drafter(self) -> None:
        """Once the block's drafts are checked enough times, have it make as many a step as
        pay (draft_sources.drafts_that_pay, by the step cost's one-stream rows and the block's
        measured passes), and stop running it where none does; prompt lookup drafts alone
        then."""
        cost, runner = self.step_cost, self.runner
        if not cost.is_known or self.scheduler.proposer.model.num_checked < MIN_BLOCK_CHECKS:
            return
        acceptance = self.scheduler.proposer.model.overall_acceptance
        block = runner.mtp_seconds.mean
        num = drafts_that_pay(acceptance, cost, block, runner.mtp_chain_seconds.mean,
                              self.config.num_speculative_tokens)
        if num:
            runner.num_mtp_drafts = num
            return
        runner.drafts_with_mtp = False
        logger.info("The model's multi-token-prediction drafts were kept %.0f%% of the time; a "
                    "step verifying one takes %.1f ms here and one without the block %.1f ms "
                    "(the block itself %.1f ms a step): it does not pay, and stops; prompt "
                    "lookup drafts alone", 100 * acceptance, cost.seconds(2) * 1e3,
                    (cost.seconds(1) - block) * 1e3, block * 1e3)

    def _validate_token_ids(self, params: SamplingParams) -> None:
        """Token ids a request names must be in the model's vocabulary."""
        vocab = self.runner.vocab_size
        for name, ids in (("logit_bias", params.logit_bias or ()),
                          ("allowed_token_ids", params.allowed_token_ids or ())):
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise ValueError(f"SamplingParams.{name} names token {bad}, outside the "
                                 f"vocabulary [0, {vocab})")

    def _fail(self, sched: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        outputs = []
        for item in sched.scheduled:
            self.scheduler.finish(item.seq, "error")
            out = self.output_processor.final_output(item.seq.request_id)
            out.outputs[0].error = f"{type(exc).__name__}: {exc}"
            outputs.append(out)
        return outputs

    def _record_tokens(self, n: int) -> None:
        now = time.monotonic()
        self._token_times.append((now, n))
        self._window_tokens += n
        while self._token_times and now - self._token_times[0][0] > _THROUGHPUT_WINDOW_S:
            self._window_tokens -= self._token_times.popleft()[1]

    def _recent_throughput(self) -> float:
        if len(self._token_times) < 2:
            return 0.0
        span = self._token_times[-1][0] - self._token_times[0][0]
        tokens = self._window_tokens - self._token_times[0][1]  # those after the first time
        return tokens / span if span > 0 else 0.0


def _proposer(config: EngineConfig, drafts_itself: bool) -> NgramProposer | DraftSources | None:
    """Prompt lookup; where the model drafts itself (a multi-token-prediction block), its
    drafts with prompt lookup as the fallback."""
    if config.num_speculative_tokens == 0:
        return None
    lookup = NgramProposer(config.num_speculative_tokens, config.ngram_min, config.ngram_max)
    if not drafts_itself:
        return lookup
    return DraftSources(ModelDrafts(config.num_speculative_tokens), lookup)


def _eos_token_ids(loaded: LoadedModel) -> frozenset[int]:
    ids = set()
    try:
        gen = GenerationConfig.from_pretrained(loaded.path)
    except (OSError, ValueError):
        gen = None
    for source in (getattr(gen, "eos_token_id", None), loaded.config.eos_token_id,
                   loaded.tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return frozenset(ids)
