"""Engine settings, with defaults chosen for a laptop CPU (and for CUDA when device="cuda")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# "auto": a GGUF file keeps its own quantization, a Hugging Face folder loads as it is.
# "none": every weight dequantized to the compute dtype (the parity reference).
QUANTIZATIONS = ("auto", "none", "int8", "int4")
# "auto": the compute dtype (pagoda.engine.models.kv_cache_sizing).
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
# "auto": pagoda.engine.models.vision_dtype decides by the device and what its CPU multiplies.
VISION_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    # Steps with more running sequences than this propose no drafts; None: the step cost decides.
    speculative_disable_by_batch_size: int | None = None


DEFAULT_DISK_CACHE_BYTES = 2 << 30


@dataclass(slots=True)
class EngineConfig:
    """What `LLM(...)` and `AsyncEngine(...)` accept besides the model.

    kv_cache_memory: bytes for the KV pool on CPU; None (the default) sizes it from the model and
    max_model_len (the rule in pagoda/engine/models/kv_cache_sizing.py); num_kv_blocks overrides both.
    kv_cache_dtype: what the KV pool keeps keys and values in: "auto" (the compute dtype),
    "float32", "bfloat16" or "float16" (half the memory; attention still computes in dtype).
    max_num_batched_tokens: the per-step token budget shared by decodes and prefill chunks.
    dtype: weights and KV cache; None picks float32 on CPU and bfloat16 on CUDA.
    gpu_memory_utilization: on CUDA, the fraction of the GPU's total memory this engine may hold
    (weights, activations, CUDA graphs and the KV pool, which takes what is left).
    kernel_backend: "auto" (Triton on CUDA, torch elsewhere), "torch" or "triton".
    enforce_eager: on CUDA, run decode steps without capturing CUDA graphs.
    num_speculative_tokens: the most draft tokens proposed per decoding sequence by n-gram prompt
    lookup and verified in the same step (0 turns speculation off). How many are verified, from
    none to this, is decided each step from what a step of that many rows costs here (timed at
    load and as the engine runs) and how often each sequence's drafts are kept.
    ngram_max, ngram_min: the longest and shortest suffix (in tokens) looked up in the context.
    speculative_disable_by_batch_size: steps with more running sequences than this do not
    speculate; None (the default) leaves it to the step cost.
    speculative_cost_model: False verifies every draft found, whatever it costs (rows taken as
    free): for tests of verification itself, and to compare against the cost model.
    quantization: how weights are kept in memory: "auto" (a GGUF file keeps its own
    quantization, a Hugging Face folder loads as it is), "none" (everything dequantized to
    dtype), "int8" (per output channel) or "int4" (groups of 32) quantized on load.
    disk_cache_dir: a folder where full prefix-cache blocks are kept across restarts (None, the
    default, keeps the prefix cache in memory only); disk_cache_bytes caps what it holds, least
    recently used blocks going first.
    vision_dtype: what a multimodal model's vision tower computes in: "auto" (bfloat16 on a CPU
    that multiplies it natively, AVX512-BF16 or AMX, float32 on other CPUs; on CUDA the compute
    dtype where it is 16-bit, else bfloat16), "float32", "bfloat16" or "float16". Its output
    joins the language model in the compute dtype whatever this is.
    """

    block_size: int = 16
    kv_cache_memory: int | None = None
    kv_cache_dtype: str = "auto"
    num_kv_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    dtype: torch.dtype | None = None
    device: str = "cpu"
    num_threads: int | None = None
    gpu_memory_utilization: float = 0.9
    kernel_backend: str = "auto"
    enforce_eager: bool = False
    num_speculative_tokens: int = 0
    ngram_max: int = 4
    ngram_min: int = 1
    speculative_disable_by_batch_size: int | None = None
    speculative_cost_model: bool = True
    quantization: str = "auto"
    disk_cache_dir: str | os.PathLike | None = None
    disk_cache_bytes: int = DEFAULT_DISK_CACHE_BYTES
    # A GGUF model's vision tower: the `mmproj` file llama.cpp's converter writes beside it
    # (pagoda/engine/loading/mmproj.py); None: the model reads text only (a folder brings its own).
    mmproj: str | os.PathLike | None = None
    vision_dtype: str = "auto"

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name}={getattr(self, name)!r} must be >= 1")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError(f"EngineConfig.kv_cache_memory={self.kv_cache_memory!r} must be >= 1 "
                             "(bytes), or None to size the KV cache from the model")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"EngineConfig.kv_cache_dtype={self.kv_cache_dtype!r} must be one of "
                             f"{', '.join(KV_CACHE_DTYPES)}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"EngineConfig.num_kv_blocks={self.num_kv_blocks!r} must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"EngineConfig.max_model_len={self.max_model_len!r} must be >= 2")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"EngineConfig.gpu_memory_utilization={self.gpu_memory_utilization!r}"
                             " must be in (0, 1]")
        if self.kernel_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"EngineConfig.kernel_backend={self.kernel_backend!r} must be "
                             "'auto', 'torch' or 'triton'")
        if self.num_speculative_tokens < 0:
            raise ValueError(f"EngineConfig.num_speculative_tokens={self.num_speculative_tokens!r}"
                             " must be >= 0 (0 turns speculation off)")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"EngineConfig.ngram_min={self.ngram_min!r} and ngram_max="
                             f"{self.ngram_max!r} must satisfy 1 <= ngram_min <= ngram_max")
        if (self.speculative_disable_by_batch_size is not None
                and self.speculative_disable_by_batch_size < 1):
            raise ValueError("EngineConfig.speculative_disable_by_batch_size="
                             f"{self.speculative_disable_by_batch_size!r} must be >= 1 or None")
        if self.disk_cache_bytes < 0:
            raise ValueError(f"EngineConfig.disk_cache_bytes={self.disk_cache_bytes!r} must be "
                             ">= 0 (0 keeps nothing on disk)")
        if self.vision_dtype not in VISION_DTYPES:
            raise ValueError(f"EngineConfig.vision_dtype={self.vision_dtype!r} must be one of "
                             f"{', '.join(VISION_DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"EngineConfig.quantization={self.quantization!r} must be one of "
                             f"{', '.join(QUANTIZATIONS)}")
        if self.dtype is None:
            import torch  # here, not above: the app reads QUANTIZATIONS before torch is imported

            self.dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32

    def resolved_num_threads(self) -> int:
        return self.num_threads or len(os.sched_getaffinity(0))
