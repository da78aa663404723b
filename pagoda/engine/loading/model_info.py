"""What a model is and the memory it will take, read from its headers only: no tensor data.

A GGUF file through `gguf.GGUFReader` (memory-mapped: tensor types and element counts), a
Hugging Face folder through its safetensors headers (dtypes and shapes). The app shows this in
its model picker and refuses, before loading starts, a model that would not fit in memory.

The model's shape (layers, key-value heads, each layer's attention window, its context) comes
from the config the loader would build, without the tokenizer: a folder's config.json, a GGUF
file's keys as its family reads them. The KV cache is sized from it
(pagoda.engine.models.kv_cache_sizing.model_kv_cache_bytes: a windowed layer holds only its window).

A mixture-of-experts model is sized twice (pagoda.engine.loading.expert_footprint): its total (every
expert) and what a token reads (top_k of E experts). A GGUF file's experts stay memory-mapped, in
the page cache rather than in a copy of our own: they need the RAM to be read at memory speed,
but the OS can drop and re-read them, so only the rest must fit in what is available.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import gguf
import torch
import transformers
from safetensors import SafetensorError, safe_open

from pagoda.engine.config import QUANTIZATIONS, EngineConfig
from pagoda.engine.errors import MalformedGGUFError, ModelLoadError
from pagoda.engine.loading.expert_footprint import (
    ExpertRouting,
    is_expert_tensor,
    routing_from_config,
    routing_from_gguf,
)
from pagoda.engine.loading.gguf import GGUFModelFile, open_gguf_reader
from pagoda.engine.loading.layouts import (
    GGUF_BLOCK_BYTES_PER_ELEMENT,
    VOCABULARY_MATRICES,
    Layout,
    gguf_layout,
)
from pagoda.engine.loading.loader import default_model_file, model_name
from pagoda.engine.loading.model_check import refuse_unrunnable_model
from pagoda.engine.loading.system_memory import available_memory, total_memory
from pagoda.engine.models.architecture import ModelShape
from pagoda.engine.models.config import model_shape
from pagoda.engine.models.gguf_config import llama_shape
from pagoda.engine.models.kv_cache_sizing import model_kv_cache_bytes
from pagoda.engine.models.mtp import PREFIX as MTP_PREFIX
from pagoda.engine.models.registry import (
    architecture_of,
    family_for_gguf,
    header_shape,
    text_model_config,
)
from pagoda.engine.quantization.expert_weights import IN_PLACE_EXPERT_TYPES
from pagoda.engine.quantization.tensors import INT4_GROUP_SIZE

logger = logging.getLogger(__name__)

GIB = 1 << 30
# Resident bytes per weight element in the layouts the engine keeps (pagoda/engine/quantization/),
# measured with bench/quantized.py. int4: the CPU kernel's packed nibbles with a bf16 scale and
# zero per 32 values.
INT4_BYTES_PER_ELEMENT = 0.625
# int8, in groups of 32: run as two int4 halves (pagoda/engine/quantization/split_int8.py).
INT8_BYTES_PER_ELEMENT = 1.25
# The vocabulary (embedding, lm_head) also keeps its exact layout, for embedding lookups and to
# recompute the top logits (pagoda/engine/layers/lm_head.py): int8 values with fp32 scales per 32, or
# int4 nibbles with fp32 scale and min per 32.
VOCABULARY_EXACT_BYTES = {"int8": 1.125, "int4": 0.75}
# Beyond weights and KV cache: activations of a step, the tokenizer, a tensor being converted.
MEMORY_OVERHEAD_BYTES = 512 << 20

ModelFormat = Literal["gguf", "safetensors"]

_FLOAT_LABELS = {"F64": "fp64", "F32": "fp32", "F16": "fp16", "BF16": "bf16"}
_DTYPE_LABELS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_GGUF_FLOAT_TYPES = {label: name for name, label in _FLOAT_LABELS.items() if name != "F64"}


@dataclass(slots=True, frozen=True)
class TensorHeader:
    """One tensor as its file describes it. shape is (out, in) for a matrix; kind is the
    file's type label: "Q4_1", "Q8_0", "fp32", "bf16"."""

    name: str
    kind: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return self.kind in _FLOAT_LABELS.values()


@dataclass(slots=True, frozen=True)
class ModelInfo:
    """quantization: how the weights will be kept under the requested setting, as a user reads
    it ("Q4_1" for a GGUF under "auto", "int4", "fp32"); file_quantization: what the file holds.
    weight_bytes: the memory all the weights will take, mapped_bytes of it memory-mapped from
    the file (a GGUF's experts: page cache the OS may drop and read again), the rest resident.
    num_active_parameters, active_bytes: what one token reads (a dense model: all of it);
    routing: a mixture of experts' E and top_k, None for a dense model."""

    name: str
    path: Path
    format: ModelFormat
    quantization: str
    file_quantization: str
    num_parameters: int
    weight_bytes: int
    num_active_parameters: int = 0
    active_bytes: int = 0
    mapped_bytes: int = 0
    routing: ExpertRouting | None = None

    @property
    def resident_bytes(self) -> int:
        """The weights' memory that is the process's own, which must fit in what is available."""
        return self.weight_bytes - self.mapped_bytes


@dataclass(slots=True, frozen=True)
class ModelHeaders:
    """A model's tensors as its files describe them, and its shape (None where not read): read
    once, described under any setting."""

    path: Path
    format: ModelFormat
    tensors: tuple[TensorHeader, ...]
    shape: ModelShape | None = None
    routing: ExpertRouting | None = None
    # Where the files carry a multi-token-prediction block (pagoda.engine.models.mtp): the
    # main layer its own is shaped like; None where they carry none.
    mtp_like: int | None = None

    def without_mtp(self) -> ModelHeaders:
        """The headers less the block's tensors: what is loaded where it is not built."""
        if self.mtp_like is None or self.shape is None:
            return self
        layers = self.shape.num_layers
        return replace(self, tensors=tuple(t for t in self.tensors
                                           if not is_mtp_tensor(t.name, layers)),
                       mtp_like=None)


def is_mtp_tensor(name: str, num_layers: int) -> bool:
    """Whether a tensor is the multi-token-prediction block's: a folder's mtp.*, or a GGUF
    file's block after the model's num_layers layers (blk.N.*, the converter's)."""
    if name.startswith(MTP_PREFIX):
        return True
    parts = name.split(".")
    return parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) >= num_layers


def describe_model(source: str | os.PathLike | None = None, quantization: str = "auto",
                   dtype: torch.dtype = torch.float32) -> ModelInfo:
    """source: a .gguf file, a Hugging Face folder, or None for the bundled default model.
    dtype: the compute dtype float weights are kept in (float32 on CPU)."""
    return describe_headers(read_model_headers(source), quantization, dtype)


def read_model_headers(source: str | os.PathLike | None = None) -> ModelHeaders:
    """The slow part of describe_model (a GGUF's metadata is parsed whole: about 2 s for the
    default model's tokenizer), done once per file. A model Pagoda does not run (its family,
    a tensor type) is refused first, from the header's scan alone."""
    path = _existing_path(source)
    refuse_unrunnable_model(path)
    if path.is_dir():
        tensors = tuple(read_safetensors_headers(path))
        mtp = any(t.name.startswith(MTP_PREFIX) for t in tensors)
        return ModelHeaders(path, "safetensors", tensors, _folder_shape(path),
                            _folder_routing(path), _mtp_like(_folder_config(path)) if mtp else None)
    if path.suffix.lower() == ".gguf":
        return _read_gguf(path)
    raise ModelLoadError(
        f"{path} is neither a model folder nor a .gguf file. Choose a Hugging Face model "
        "folder (config.json, *.safetensors, tokenizer files) or a .gguf file.")


def describe_headers(headers: ModelHeaders, quantization: str = "auto",
                     dtype: torch.dtype = torch.float32) -> ModelInfo:
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} must be one of {', '.join(QUANTIZATIONS)}")
    tensors, routing = headers.tensors, headers.routing
    experts = [t for t in tensors if is_expert_tensor(t.name)]
    if experts and routing is None:
        raise ModelLoadError(
            f"{headers.path} holds routed experts ({experts[0].name}) but does not say how many "
            "there are and how many a token uses (a GGUF's expert_count and expert_used_count, "
            "config.json's num_experts and num_experts_per_tok). The file is incomplete or "
            "damaged: re-download it.")
    share = routing.active_share if routing is not None else 1.0
    total = mapped = active = active_parameters = 0.0
    for t in tensors:
        routed = routing is not None and is_expert_tensor(t.name)
        in_place = routed and _stays_mapped(t, quantization, headers.format)
        nbytes = (gguf_file_bytes(t) if in_place
                  else resident_bytes(t, quantization, dtype, headers.format))
        total += nbytes
        mapped += nbytes if in_place else 0
        active += nbytes * share if routed else nbytes
        active_parameters += t.numel * share if routed else t.numel
    file_label = file_quantization(tensors)
    return ModelInfo(
        name=model_name(headers.path), path=headers.path, format=headers.format,
        quantization=_loaded_label(file_label, quantization, dtype),
        file_quantization=file_label,
        num_parameters=sum(t.numel for t in tensors),
        weight_bytes=round(total), num_active_parameters=round(active_parameters),
        active_bytes=round(active), mapped_bytes=round(mapped), routing=routing,
    )


def _stays_mapped(expert: TensorHeader, quantization: str, model_format: ModelFormat) -> bool:
    """Whether an expert tensor is read in place from the file's memory map: a GGUF's, under
    "auto", in a block type the expert kernel reads (pagoda/engine/quantization/expert_weights.py), as
    llama.cpp keeps them. Converted to another layout, experts are resident."""
    return (model_format == "gguf" and quantization == "auto"
            and expert.kind in IN_PLACE_EXPERT_TYPES)


def gguf_file_bytes(tensor: TensorHeader) -> float:
    """The bytes tensor takes in its GGUF file (and so in the file's memory map)."""
    type_name = _GGUF_FLOAT_TYPES.get(tensor.kind, tensor.kind)
    block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return tensor.numel * block_bytes / block


def _read_gguf(path: Path) -> ModelHeaders:
    try:
        model_file = GGUFModelFile(path)
    except MalformedGGUFError:
        raise
    except ModelLoadError:
        # Not a whole model (a layer's tensor or a key missing: the loader refuses it, saying
        # which); its tensors still tell its size, and the fit check takes the KV cache's bound.
        reader = open_gguf_reader(path)
        return ModelHeaders(path, "gguf", _gguf_tensor_headers(reader.tensors),
                            routing=_gguf_routing(reader, path))
    tensors = _gguf_tensor_headers(model_file.tensors.values())
    shape = gguf_shape(model_file)
    mtp = any(is_mtp_tensor(t.name, shape.num_layers) for t in tensors)
    config = family_for_gguf(model_file.architecture).config_from_gguf(model_file) if mtp else None
    return ModelHeaders(path, "gguf", tensors, shape,
                        routing_from_gguf(model_file.metadata, model_file.architecture, str(path)),
                        None if config is None else _mtp_like(config))


def _gguf_routing(reader: gguf.GGUFReader, path: Path) -> ExpertRouting | None:
    def metadata(key: str) -> object:
        field = reader.get_field(key)
        return None if field is None else field.contents()

    architecture = metadata("general.architecture")
    if not isinstance(architecture, str):
        return None
    return routing_from_gguf(metadata, architecture, str(path))


def _gguf_tensor_headers(tensors: Iterable[gguf.ReaderTensor]) -> tuple[TensorHeader, ...]:
    return tuple(TensorHeader(t.name, tensor_kind(t.tensor_type.name),
                              tuple(int(d) for d in reversed(t.shape)))
                 for t in tensors)


def gguf_shape(model_file: GGUFModelFile) -> ModelShape:
    """The model's shape from the file's keys, without the tokenizer: the family's own config
    where it reads one (its windows and layer kinds), else the keys every Llama-shaped file
    states as transformers reads them."""
    config = family_for_gguf(model_file.architecture).config_from_gguf(model_file)
    if config is None:
        return model_shape(transformers.PretrainedConfig(**llama_shape(model_file)))
    return header_shape(config)


def _folder_shape(folder: Path) -> ModelShape:
    try:
        return header_shape(_folder_config(folder))
    except (ValueError, KeyError) as error:
        raise ModelLoadError(f"{folder / 'config.json'} could not be read as a model config: "
                             f"{error}. Re-download the model.") from error


def _folder_config(folder: Path) -> transformers.PretrainedConfig:
    try:
        return text_model_config(transformers.AutoConfig.from_pretrained(folder))
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"{folder / 'config.json'} could not be read as a model config: "
                             f"{error}. Re-download the model.") from error


def _mtp_like(config: transformers.PretrainedConfig) -> int | None:
    """The main layer a multi-token-prediction block is shaped like, for the family the config
    is of (None for one that has no such block)."""
    return architecture_of(config).mtp_like


def _folder_routing(folder: Path) -> ExpertRouting | None:
    """config.json's experts, read as its raw keys (every family names them alike); the file
    was read whole by _folder_config already."""
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    return routing_from_config(config, str(config_file)) if isinstance(config, dict) else None


def read_safetensors_headers(folder: Path) -> list[TensorHeader]:
    if not (folder / "config.json").is_file():
        raise ModelLoadError(
            f"{folder} is not a model folder: it has no config.json. Choose a Hugging Face model "
            "folder (config.json, *.safetensors, tokenizer files) or a .gguf file.")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"{folder} has no weight files (*.safetensors). Pagoda reads safetensors only: "
            "download the safetensors version of the model, or choose a .gguf file.")
    return [header for file in files for header in _safetensors_file_headers(file)]


def _safetensors_file_headers(file: Path) -> list[TensorHeader]:
    try:
        with safe_open(file, framework="numpy") as tensors:
            names = tensors.keys()  # a safe_open handle is not iterable itself
            return [_safetensors_header(name, tensors.get_slice(name)) for name in names]
    except (SafetensorError, OSError) as error:
        raise ModelLoadError(
            f"Weight file {file} is truncated or corrupt ({error}). Re-download it.") from error


def _safetensors_header(name: str, tensor_slice) -> TensorHeader:
    dtype = tensor_slice.get_dtype()
    return TensorHeader(name, _FLOAT_LABELS.get(dtype, dtype.lower()),
                        tuple(tensor_slice.get_shape()))


def file_quantization(tensors: Sequence[TensorHeader]) -> str:
    """The most common type among the matrices: a Q4_K_M file (mostly Q4_K, some Q6_K) reads
    "Q4_K"; the default model's Q4_1 layers with a Q8_0 embedding read "Q4_1"."""
    kinds = Counter(t.kind for t in tensors if len(t.shape) >= 2) or Counter(t.kind for t in tensors)
    if not kinds:
        return "empty"
    return kinds.most_common(1)[0][0]


def resident_layout(tensor: TensorHeader, quantization: str, model_format: ModelFormat) -> Layout:
    """The layout the engine keeps this tensor in under a quantization setting. A 3-D tensor
    (a GGUF's experts, one matrix each) is kept as its matrices are."""
    if len(tensor.shape) < 2 or quantization == "none":
        return "float"
    if quantization == "int8":
        return "int8"
    if quantization == "int4":
        keeps_int8 = tensor.name in VOCABULARY_MATRICES or tensor.shape[-1] % INT4_GROUP_SIZE
        return "int8" if keeps_int8 else "int4"
    if model_format == "safetensors" or tensor.is_float:
        return "float"
    return gguf_layout(tensor.kind)


def resident_bytes(tensor: TensorHeader, quantization: str, dtype: torch.dtype,
                   model_format: ModelFormat) -> float:
    layout = resident_layout(tensor, quantization, model_format)
    if layout == "float":
        return tensor.numel * dtype.itemsize
    if quantization == "auto" and tensor.kind in GGUF_BLOCK_BYTES_PER_ELEMENT:
        return tensor.numel * GGUF_BLOCK_BYTES_PER_ELEMENT[tensor.kind]
    kernel = INT4_BYTES_PER_ELEMENT if layout == "int4" else INT8_BYTES_PER_ELEMENT
    exact = VOCABULARY_EXACT_BYTES[layout] if tensor.name in VOCABULARY_MATRICES else 0
    return tensor.numel * (kernel + exact)


def memory_needed(info: ModelInfo, kv_cache_bytes: int) -> int:
    return info.weight_bytes + kv_cache_bytes + MEMORY_OVERHEAD_BYTES


def check_model_fits(model: str | os.PathLike | None, config: EngineConfig,
                     available: int | None = None) -> ModelInfo:
    """Refuse, from its headers and before anything is loaded, a model whose weights and KV
    cache would not fit in the memory available (raises ModelLoadError saying what to do).
    A multi-token-prediction block counts only where the engine builds it (when speculating):
    its weights, and its keys in the KV cache.

    On CUDA the weights and the KV pool live on the GPU, which sizes its pool by itself.
    """
    headers = read_model_headers(model)
    if not config.num_speculative_tokens:  # the block is built (and read) only to speculate
        headers = headers.without_mtp()
    info = describe_headers(headers, config.quantization, config.dtype)
    if not config.device.startswith("cuda"):
        kv_cache_bytes = model_kv_cache_bytes(headers.shape, config, headers.mtp_like)
        check_fits_memory(info, kv_cache_bytes, available)
    return info


def check_fits_memory(info: ModelInfo, kv_cache_bytes: int, available: int | None = None,
                      total: int | None = None) -> None:
    """Raise ModelLoadError when the weights, the KV cache and the overhead exceed the memory
    available now (measured when not given; unknown on a system without psutil or /proc).

    A model's memory-mapped experts (info.mapped_bytes) are page cache, which the OS drops and
    reads again as it needs: only the rest must fit in what is available. All of it must fit
    in the machine's RAM (total), or every step would read experts from the disk; where only
    what other programs leave now is short, the load goes on, with a warning that steps read
    experts from the disk until memory is freed."""
    if available is None:
        available = available_memory()
        if available is None:
            logger.info("cannot measure the available memory; loading %s unchecked", info.name)
            return
    needed = memory_needed(info, kv_cache_bytes)
    if needed - info.mapped_bytes > available:
        raise ModelLoadError(
            f"{info.name} ({info.quantization}) needs about {needed / GIB:.1f} GiB of memory "
            f"({_needed_parts(info, kv_cache_bytes)}), but only {available / GIB:.1f} GiB is "
            "available. Choose a smaller or more quantized model (a Q4 GGUF file), set "
            "quantization to int4 (quantization=\"int4\"), or close other programs.")
    if needed <= available:
        return
    total = total_memory() if total is None else total
    if total is not None and needed > total:
        raise ModelLoadError(
            f"{info.name} ({info.quantization}) needs about {needed / GIB:.1f} GiB of memory "
            f"({_needed_parts(info, kv_cache_bytes)}), more than this machine's "
            f"{total / GIB:.1f} GiB: its experts would be read from the disk at every step. "
            "Choose a smaller or more quantized file of the model.")
    logger.warning("%s needs about %.1f GiB with its experts in memory, %.1f GiB more than is "
                   "available now: steps read experts from the disk until other programs free "
                   "memory", info.name, needed / GIB, (needed - available) / GIB)


def _needed_parts(info: ModelInfo, kv_cache_bytes: int) -> str:
    experts = (f", of which experts {info.mapped_bytes / GIB:.1f} GiB memory-mapped from the "
               "file" if info.mapped_bytes else "")
    return (f"weights {info.weight_bytes / GIB:.1f} GiB{experts}, KV cache "
            f"{kv_cache_bytes / GIB:.1f} GiB")


def _existing_path(source: str | os.PathLike | None) -> Path:
    path = default_model_file() if source is None else Path(source).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"Model path {path} does not exist. Choose a Hugging Face model folder or a .gguf "
            "file.")
    return path


def tensor_kind(type_name: str) -> str:
    """TensorHeader.kind for a GGUF tensor type or safetensors dtype name: "Q4_K", "fp16"."""
    return _FLOAT_LABELS.get(type_name, type_name)


def _loaded_label(file_label: str, quantization: str, dtype: torch.dtype) -> str:
    if quantization in ("int8", "int4"):
        return quantization
    if quantization == "none":
        return _DTYPE_LABELS.get(dtype, str(dtype).removeprefix("torch."))
    return file_label
