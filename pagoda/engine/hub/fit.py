"""Whether a model on the Hub would fit in this machine's memory, before it is downloaded.

The loader's estimate (pagoda.engine.loading.model_info: resident bytes per layout, plus the KV cache and the
overhead) applied to a parameter count instead of a file's tensor headers: the Hub's count, or
one derived from the file's size and its quantization's bits per weight. A GGUF file larger
than its count at its main type holds some tensors at Q6_K (llama.cpp's mixes: the output
matrix, some attention and feed-forward ones), priced as such. Without the headers the
vocabulary's exact copy (pagoda.engine.loading.model_info.VOCABULARY_EXACT_BYTES) is not counted: the loader
asks for that much more, 3% for SmolLM2-135M's Q4_1 file, nearer a fifth for a quantized model
with a large vocabulary (Qwen2.5-7B's Q4_K_M file). The KV cache comes from the repository's
config.json where it has one (`kv_cache_bytes`), else it is the cap.

A mixture of experts' config.json also tells how many of the parameters are routed experts
(`experts_of`): a token reads top_k of each layer's E, so the fit counts the active parameters
too, and a GGUF file's experts at the file's own bytes, memory-mapped as the loader keeps them
(pagoda.engine.loading.model_info). A repository without a config.json (many GGUF ones) is counted
as dense.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import transformers
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.hub.search import HubFile, HubRepo, main_tensor_type
from pagoda.engine.loading.expert_footprint import (
    ExpertRouting,
    expert_parameters,
    routing_from_config,
)
from pagoda.engine.loading.model_check import check_config_supported
from pagoda.engine.loading.model_info import (
    MEMORY_OVERHEAD_BYTES,
    ModelFormat,
    TensorHeader,
    available_memory,
    resident_bytes,
    tensor_kind,
    total_memory,
)
from pagoda.engine.models.architecture import ModelShape
from pagoda.engine.models.kv_cache_sizing import model_kv_cache_bytes
from pagoda.engine.models.registry import header_shape
from pagoda.engine.quantization.expert_weights import IN_PLACE_EXPERT_TYPES
from pagoda.engine.quantization.tensors import INT4_GROUP_SIZE

# fits: fits in the memory available now; tight: in the machine's RAM, not in what other
# programs leave now; too_big: more than the machine's RAM; unknown: memory not measurable.
FitVerdict = Literal["fits", "tight", "too_big", "unknown"]
# Checkpoints on the Hub are mostly bf16 or fp16 when the Hub does not say.
_DEFAULT_SAFETENSORS_DTYPE = "BF16"
# The type llama.cpp keeps a mix's larger tensors in.
_MIX_TYPE = "Q6_K"


@dataclass(slots=True, frozen=True)
class MemoryFit:
    """needed_bytes: weights + KV cache + overhead, as pagoda.engine.loading.model_info.memory_needed counts
    them. num_parameters: the count used, None when neither the Hub nor the file's quantization
    told it (the weights are then taken at the file's size). available_bytes, total_bytes: None
    when they cannot be measured. num_active_parameters: those a token reads (a mixture of
    experts: top_k of E experts; a dense model: all); mapped_bytes: the part of weight_bytes
    memory-mapped from the file (a GGUF's experts)."""

    verdict: FitVerdict
    needed_bytes: int
    weight_bytes: int
    num_parameters: int | None
    available_bytes: int | None
    total_bytes: int | None
    num_active_parameters: int | None = None
    mapped_bytes: int = 0


@dataclass(slots=True, frozen=True)
class Experts:
    """A mixture of experts as its config.json states it: the routing, and how many of the
    model's parameters are routed experts' (all E of every sparse layer)."""

    routing: ExpertRouting
    num_parameters: int


def experts_of(config_json: dict | None) -> Experts | None:
    """None for a dense model and for a config.json whose experts cannot be counted (no widths,
    or counts no model has): the fit then counts the model as dense."""
    if config_json is None:
        return None
    try:
        routing = routing_from_config(config_json, "config.json")
    except ModelLoadError:
        return None
    routed = expert_parameters(config_json, routing) if routing is not None else 0
    return Experts(routing, routed) if routed else None


def estimate_fit(file_quantization: str | None, size: int, num_parameters: int | None,
                 model_format: ModelFormat, kv_cache_bytes: int, available: int | None = None,
                 total: int | None = None, quantization: str = "auto",
                 dtype: torch.dtype = torch.float32, experts: Experts | None = None) -> MemoryFit:
    """file_quantization: the file's quantization ("Q4_K_M", "Q8_0", "F16"; a safetensors
    folder's dtype, "BF16"); size: its bytes on the Hub (a folder: its weight files');
    num_parameters: the Hub's count, None to derive it from size. quantization and dtype: the
    engine's settings (EngineConfig.quantization, .dtype). available and total are measured
    when not given. experts: a mixture of experts' (experts_of), None for a dense model."""
    if model_format == "safetensors":
        file_quantization = file_quantization or _DEFAULT_SAFETENSORS_DTYPE
    kind = main_tensor_type(file_quantization)
    active = mapped = None
    if kind is None:  # neither its layout nor its bytes per weight known: taken at its size
        num_parameters, weights = None, size
    else:
        num_parameters = num_parameters or parameters_from_size(size, kind)
        routed = experts.num_parameters if experts is not None else 0
        if routed > num_parameters:  # a config.json that is not this model's: counted dense
            routed = 0
        in_place = model_format == "gguf" and quantization == "auto" \
            and kind in IN_PLACE_EXPERT_TYPES
        # Mapped experts take the file's bytes, at the file's average bytes a weight.
        mapped = round(size * routed / num_parameters) if in_place else 0
        converted = num_parameters - (routed if in_place else 0)
        weights = mapped + _converted_bytes(converted, size - mapped, kind, model_format,
                                            quantization, dtype)
        share = experts.routing.active_share if routed else 1.0
        active = round(num_parameters - routed * (1 - share))
    needed = weights + kv_cache_bytes + MEMORY_OVERHEAD_BYTES
    available = available_memory() if available is None else available
    total = total_memory() if total is None else total
    return MemoryFit(_verdict(needed, available, total), needed, weights, num_parameters,
                     available, total, active, mapped or 0)


def _converted_bytes(num_parameters: int, size: int, kind: str, model_format: ModelFormat,
                     quantization: str, dtype: torch.dtype) -> int:
    """The memory of weights converted to the engine's layouts at load."""
    split = _split_by_size(num_parameters, size, kind) if model_format == "gguf" else {}
    parts = split or {kind: num_parameters}
    return round(sum(resident_bytes(_as_one_matrix(count, part), quantization, dtype,
                                    model_format) for part, count in parts.items()))


def file_fit(repo: HubRepo, file: HubFile, kv_cache_bytes: int, **settings) -> MemoryFit:
    """The fit of one GGUF file of repo (settings: estimate_fit's quantization, dtype,
    available, total, experts)."""
    return estimate_fit(file.quantization, file.size, repo.num_parameters, "gguf",
                        kv_cache_bytes, **settings)


def folder_fit(repo: HubRepo, kv_cache_bytes: int, **settings) -> MemoryFit | None:
    """The fit of repo's safetensors model folder; None when it has none."""
    weights = [f for f in repo.folder_files if f.filename.endswith(".safetensors")]
    if not weights:
        return None
    return estimate_fit(repo.weights_dtype, sum(f.size for f in weights), repo.num_parameters,
                        "safetensors", kv_cache_bytes, **settings)


def kv_cache_bytes(config_json: dict | None, settings: EngineConfig) -> int:
    """The KV cache the engine under `settings` would allocate for a model, from its config.json
    as the Hub serves it (search.repo_config): each layer counted as it holds keys, a
    sliding-window layer its window only (model_kv_cache_bytes). Without a config.json Pagoda
    reads as a model it runs: the cap (or the setting's size)."""
    return model_kv_cache_bytes(_shape(config_json), settings)


def _shape(config_json: dict | None) -> ModelShape | None:
    if config_json is None:
        return None
    try:
        check_config_supported(config_json, Path("config.json"))
        return header_shape(transformers.AutoConfig.for_model(**config_json))
    except (ModelLoadError, ValueError, KeyError, TypeError, AttributeError):
        return None


def parameters_from_size(size: int, tensor_type: str) -> int:
    """How many weights size bytes of tensor_type ("Q4_K", "BF16") hold."""
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[tensor_type]]
    return size * block // block_bytes


def _split_by_size(num_parameters: int, size: int, tensor_type: str) -> dict[str, int]:
    """The parameters of a GGUF file at its main type and at _MIX_TYPE, from the bytes it has
    beyond its count at the main type; empty when the main type is not smaller."""
    main, larger = _bytes_per_weight(tensor_type), _bytes_per_weight(_MIX_TYPE)
    if main >= larger:
        return {}
    in_larger = round((size - num_parameters * main) / (larger - main))
    in_larger = min(max(in_larger, 0), num_parameters)
    return {tensor_type: num_parameters - in_larger, _MIX_TYPE: in_larger}


def _bytes_per_weight(tensor_type: str) -> float:
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[tensor_type]]
    return block_bytes / block


def _as_one_matrix(num_parameters: int, tensor_type: str) -> TensorHeader:
    """All the weights as one matrix of the file's type, so that model_info's resident_bytes
    prices them under a setting as it prices one tensor. Rows of INT4_GROUP_SIZE: a whole
    number of int4 groups, as the engine's matrices have."""
    rows = math.ceil(num_parameters / INT4_GROUP_SIZE)
    return TensorHeader("weights", tensor_kind(tensor_type), (rows, INT4_GROUP_SIZE))


def _verdict(needed: int, available: int | None, total: int | None) -> FitVerdict:
    if available is None:
        return "unknown"
    if needed <= available:
        return "fits"
    return "tight" if total is not None and needed <= total else "too_big"
