"""Read a GGUF file as it is: config, tokenizer and weights by Hugging Face parameter names.

Quantized tensors stay quantized (`pagoda.engine.quantization.tensors`): Q4_0, Q4_1 and Q4_K blocks map
exactly onto `Int4Weight` (groups of 32 with a scale and a min), Q8_0 onto `Int8Weight`, Q6_K
stays in its blocks; the other block types the engine reads are decoded by our own code
(`pagoda.engine.loading.gguf_blocks`) and widened to `Int8Weight` in groups of 32; float tensors stay
float. Decoding works on every block of a tensor at once, so the default model's 211 matrices
take about a second.

The config and tokenizer come from transformers' GGUF support, which takes seconds on a 49k-token
vocabulary; they are saved once per file (keyed by its content) into a cache folder and read from
there afterwards.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import struct
import tempfile
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType as QType

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf_blocks import (
    DECODED_TYPES,
    dequantize_rows,
    fp16_field,
    k_quant_scales_and_mins,
    log_widened_types,
    widen_to_int8,
)
from pagoda.engine.loading.gguf_header import check_gguf_header
from pagoda.engine.loading.gguf_names import (
    A_LOG_HELD_AS_A,
    NORMS_HELD_AS_W,
    NORMS_HOLD_ONE_PLUS_W,
    PERMUTED_QK,
    final_norm_name,
    gguf_expert_slice,
    gguf_tensor_name,
    needed_layer_modules,
)
from pagoda.engine.loading.layouts import GGUF_FLOAT_TYPES, GGUF_INT4_TYPES, GGUF_INT8_TYPES
from pagoda.engine.loading.lazy_weights import LazyWeights
from pagoda.engine.loading.model_check import unreadable_type_message
from pagoda.engine.loading.populate import populate_in_background
from pagoda.engine.models import mtp
from pagoda.engine.models.moe_gguf import has_experts
from pagoda.engine.models.registry import (
    family_for_gguf,
    supported_gguf_architectures,
    unsupported_message,
)
from pagoda.engine.quantization.expert_weights import IN_PLACE_EXPERT_TYPES, expert_weight
from pagoda.engine.quantization.tensors import (
    INT4_GROUP_SIZE,
    INT8_GROUP_SIZE,
    Int4Weight,
    Int8Weight,
    IQ4XSWeight,
    Q3KWeight,
    Q5KWeight,
    Q6KWeight,
    Weight,
)
from pagoda.kernels.cpu.huge_pages import huge_page_empty

logger = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = tuple(sorted(supported_gguf_architectures()))
INT4_TYPES = frozenset(QType[name] for name in GGUF_INT4_TYPES)
INT8_TYPES = frozenset(QType[name] for name in GGUF_INT8_TYPES)
FLOAT_TYPES = frozenset(QType[name] for name in GGUF_FLOAT_TYPES)
QUANTIZATIONS = ("auto", "none", "int8", "int4")
# Kept as the file stores them, read in place by our CPU kernel (widened where it does not run).
BLOCK_WEIGHTS = {QType[kind.TYPE_NAME]: kind
                 for kind in (Q6KWeight, IQ4XSWeight, Q5KWeight, Q3KWeight)}



class GGUFModelFile:
    """One GGUF file, memory-mapped; `config_and_tokenizer` and `weights` read what it holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._reader = open_gguf_reader(path)
        self.architecture = self._read_architecture()
        self.tensors = {t.name: t for t in self._reader.tensors}
        self._check_tensor_list()

    def _read_architecture(self) -> str:
        field = self._reader.get_field("general.architecture")
        architecture = field.contents() if field is not None else None
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(unsupported_message(architecture, str(self.path)))
        return architecture

    def _check_tensor_list(self) -> None:
        """Refuse a file that lacks a matrix or norm every model of its architecture needs, or
        holds one in a type Pagoda cannot read, from its header alone: milliseconds, where its
        tokenizer takes seconds and its weights more. Shapes are checked against the config."""
        if not self.tensors:
            raise ModelLoadError(
                f"{self.path} holds no tensors: it has a model's settings but none of its "
                "weights. The file is incomplete: re-download it.")
        needed = self._needed_tensors()
        missing = [hf for hf in needed if self.tensor_name(hf) not in self.tensors]
        if missing:
            shown = ", ".join(f"{self.tensor_name(hf)} ({hf})" for hf in missing[:3])
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ModelLoadError(
                f"{self.path} has no tensor {shown}{more}, which every {self.architecture} "
                "model needs. The file is incomplete or damaged: re-download it.")
        for hf in needed:
            self._check_readable(self.tensors[self.tensor_name(hf)])

    def _needed_tensors(self) -> list[str]:
        """The Hugging Face names of the weights every model of the file's architecture and
        layer count has (biases and a separate output matrix vary, and are checked later)."""
        field = self._reader.get_field(f"{self.architecture}.block_count")
        if field is None:
            raise ModelLoadError(
                f"{self.path} does not say how many layers its model has (no "
                f"{self.architecture}.block_count). The file is damaged: re-download it.")
        layers = int(field.contents())
        modules = needed_layer_modules(self.architecture, experts=has_experts(self))
        if layers * len(modules) > len(self.tensors):  # bounds the list before it is built
            raise ModelLoadError(
                f"{self.path} holds {len(self.tensors)} tensors, too few for the {layers} "
                "layers its settings state. The file is incomplete: re-download it.")
        return ["model.embed_tokens.weight", final_norm_name(self.architecture),
                *(f"model.layers.{i}.{module}.weight"
                  for i in range(layers) for module in modules)]

    def _check_readable(self, tensor: gguf.ReaderTensor) -> None:
        if tensor.tensor_type not in INT4_TYPES | INT8_TYPES | FLOAT_TYPES:
            raise ModelLoadError(unreadable_type_message(tensor.name, tensor.tensor_type.name,
                                                         self.path))

    def config_and_tokenizer(
        self, cache: Path
    ) -> tuple[transformers.PretrainedConfig, transformers.PreTrainedTokenizerBase]:
        """From cache (a folder for this file's content) when it holds them, else built from the
        file and saved there for the next load."""
        cached = _read_cached_metadata(cache)
        if cached is not None:
            return cached
        logger.info("Reading the tokenizer of %s (once; later loads take it from %s)",
                    self.path.name, cache)
        config, tokenizer = self._build_config_and_tokenizer()
        _write_cached_metadata(cache, config, tokenizer)
        return config, tokenizer

    def _build_config_and_tokenizer(
        self,
    ) -> tuple[transformers.PretrainedConfig, transformers.PreTrainedTokenizerBase]:
        folder, name = self.path.parent, self.path.name
        # Families whose files transformers does not read, or reads with defaults in place of
        # the file's settings, build their config from the file's keys themselves.
        config = family_for_gguf(self.architecture).config_from_gguf(self)
        try:
            if config is None:
                config = self._transformers_config(folder, name)
                tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
            else:  # AutoTokenizer would read the config through transformers first
                tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(
                    folder, gguf_file=name)
        except Exception as error:
            raise ModelLoadError(
                f"The config or tokenizer of {self.path} could not be read: "
                f"{str(error).rstrip('.')}. "
                "Re-download the file."
            ) from error
        return config, tokenizer

    def _transformers_config(self, folder: Path, name: str) -> transformers.PretrainedConfig:
        config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name)
        # transformers leaves head_dim at its class default for these architectures (Qwen3: 128),
        # which is wrong for a model whose heads are not that size. (A family's own config reads
        # its head sizes itself: Gemma 4's key_length is its global layers'.)
        head_dim = self._reader.get_field(f"{self.architecture}.attention.key_length")
        if head_dim is not None:
            config.head_dim = int(head_dim.contents())
        return config

    # What a family reads to build its config (pagoda.engine.models.gguf_config.GGUFSettings).

    def metadata(self, key: str) -> object:
        field = self._reader.get_field(key)
        return None if field is None else field.contents()

    def tensor_dims(self, name: str) -> tuple[int, ...] | None:
        tensor = self.tensors.get(name)
        return None if tensor is None else tensor_shape(tensor)

    def small_vector(self, name: str, length: int) -> list[float] | None:
        tensor = self.tensors.get(name)
        if tensor is None:
            return None
        if tensor_shape(tensor) != (length,) or tensor.tensor_type not in FLOAT_TYPES:
            raise ModelLoadError(
                f"Tensor {name} in {self.path} holds {tensor_shape(tensor)} values as "
                f"{tensor.tensor_type.name}, where its model needs {length} floats. The file "
                "is damaged: re-download it.")
        return dequantize_to_float(tensor.data, tensor.tensor_type, (length,)).tolist()

    def weights(
        self, expected: dict[str, tuple[int, ...]], config: transformers.PretrainedConfig,
        quantization: str = "auto", dtype: torch.dtype = torch.float32,
    ) -> LazyWeights:
        """The parameters named in expected (HF name -> shape), all checked now and each decoded
        when first asked for (`pagoda.engine.loading.lazy_weights`).

        "auto", "int8" and "int4" keep blocks in the engine's layouts (requantizing to int8/int4
        is a later, shared step); "none" dequantizes every tensor to dtype. Float matrices are
        cast to dtype; under "auto", 1-D tensors (norms, biases) are float32.
        """
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization={quantization!r} must be one of {QUANTIZATIONS}")
        slices = {name: where for name in expected
                  if (where := gguf_expert_slice(self._converter_side(name),
                                                 self.architecture)) is not None}
        experts = Counter(stacked for stacked, _ in slices.values())
        tensors = {name: self._checked_tensor(name, shape, slices.get(name), experts)
                   for name, shape in expected.items()}
        if quantization != "none":
            log_widened_types(tensor.tensor_type for tensor in tensors.values()
                              if tensor.tensor_type not in BLOCK_WEIGHTS)
            # The experts' 3-D tensors, read in place: mapped by a thread before their first
            # steps (pagoda/engine/loading/populate.py).
            stacked = {slices[name][0]: tensors[name] for name in slices}
            populate_in_background([t.data for t in stacked.values()
                                    if t.tensor_type.name in IN_PLACE_EXPERT_TYPES])

        def decode(name: str) -> Weight:
            tensor = tensors[name]
            if name in slices:
                return _decode_expert(tensor.data[slices[name][1]], tensor.tensor_type,
                                      expected[name], quantization, dtype)
            rows = self._rows_in_hf_order(name, tensor, config)
            if self._holds_one_plus_w(name):
                return _norm_less_one(rows, tensor.tensor_type, expected[name])
            if self.architecture in A_LOG_HELD_AS_A and name.endswith(".A_log"):
                return self._a_log(name, rows, tensor.tensor_type, expected[name])
            return _decode(rows, tensor.tensor_type, expected[name], quantization, dtype)

        return LazyWeights(tensors, decode)

    def _holds_one_plus_w(self, hf_name: str) -> bool:
        hf_name = self._converter_side(hf_name)  # a block's enorm and hnorm hold 1 + w
        return (self.architecture in NORMS_HOLD_ONE_PLUS_W and hf_name.endswith("norm.weight")
                and not hf_name.endswith(NORMS_HELD_AS_W))

    def _a_log(self, hf_name: str, data: np.ndarray, kind: QType,
               shape: tuple[int, ...]) -> torch.Tensor:
        """A Mamba-2 layer's A_log from the A = -exp(A_log) the file holds, in float64 (the
        mixer's -exp of it gives the file's A back to within a float32 rounding)."""
        a = dequantize_to_float(data, kind, shape).double()
        if not (a < 0).all():
            raise ModelLoadError(
                f"Tensor {self.tensor_name(hf_name)} in {self.path} holds a value that is not "
                "negative, where a recurrent layer's A = -exp(A_log) is. The file is damaged: "
                "re-download it.")
        return torch.log(-a)

    def tensor_name(self, hf_name: str) -> str:
        """The GGUF name of a Hugging Face parameter in this file's architecture (a
        multi-token-prediction block's: in the block after the model's layers)."""
        return gguf_tensor_name(self._converter_side(hf_name), self.architecture)

    def _converter_side(self, hf_name: str) -> str:
        """The name the converter gave a parameter before its GGUF naming: a multi-token-
        prediction block's as a layer after the model's (pagoda.engine.models.mtp)."""
        if hf_name.startswith(mtp.PREFIX):
            return mtp.converter_name(hf_name, self._model_layers())
        return hf_name

    def has_tensor(self, hf_name: str) -> bool:
        """Whether the file holds the parameter (an expert's: its experts' 3-D tensor)."""
        name = self._converter_side(hf_name)
        expert = gguf_expert_slice(name, self.architecture)
        return (gguf_tensor_name(name, self.architecture) if expert is None
                else expert[0]) in self.tensors

    def _model_layers(self) -> int:
        """The blocks that are the model's layers: all but the multi-token-prediction ones
        the converter writes after them."""
        blocks = self._reader.get_field(f"{self.architecture}.block_count")
        extra = self._reader.get_field(f"{self.architecture}.nextn_predict_layers")
        return int(blocks.contents()) - (0 if extra is None else int(extra.contents()))

    def _checked_tensor(self, hf_name: str, shape: tuple[int, ...],
                        expert: tuple[str, int] | None, experts: Counter[str]) -> gguf.ReaderTensor:
        """expert: where an expert's matrix lies (`gguf_expert_slice`); experts: how many
        experts the config gives each 3-D tensor, whose matrices it stacks outermost."""
        name = self.tensor_name(hf_name) if expert is None else expert[0]
        if expert is not None:
            shape = (experts[name], *shape)
        tensor = self.tensors.get(name)
        if tensor is None:
            raise ModelLoadError(
                f"{self.path} has no tensor {name} ({hf_name}), which its {self.architecture} "
                "config needs. The file is incomplete or damaged: re-download it."
            )
        got = tensor_shape(tensor)
        # llama.cpp's own writer (llama-quantize) keeps a [1, n] matrix as its n values: Qwen2-MoE's
        # shared expert gate (ffn_gate_inp_shexp), which its converter wrote as [1, n]; its
        # converter writes a depthwise convolution's [channels, 1, kernel] taps as
        # [channels, kernel] (LFM2's shortconv.conv), and some of Mamba-2's vectors as matrices
        # of their values in order (ssm_a and ssm_d [heads, 1], ssm_norm [groups, width]).
        if got != shape and got != squeezed_shape(shape) and not _vector_as_matrix(got, shape):
            raise ModelLoadError(
                f"Tensor {name} ({hf_name}) in {self.path} has shape {got}, but the file's config "
                f"implies {shape}. The file is damaged: re-download it."
            )
        self._check_readable(tensor)
        return tensor

    def _rows_in_hf_order(self, hf_name: str, tensor: gguf.ReaderTensor,
                          config: transformers.PretrainedConfig) -> np.ndarray:
        """The tensor's raw rows; for llama q and k reordered, as llama.cpp's converter
        interleaved the rotary halves of each head. A row is whole blocks, so this is exact
        for every type (and numpy's row gather is ~500x faster than torch's on uint8)."""
        if self.architecture not in PERMUTED_QK:
            return tensor.data
        if ".self_attn.q_proj." in hf_name:
            heads = config.num_attention_heads
        elif ".self_attn.k_proj." in hf_name:
            heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        else:
            return tensor.data
        return tensor.data[rotary_unpermutation(tensor.data.shape[0], heads).numpy()]


def _vector_as_matrix(got: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return len(shape) == 1 and math.prod(got) == shape[0]


def squeezed_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape without its 1s but the last dimension: what llama.cpp's files hold of it."""
    return tuple(d for d in shape[:-1] if d != 1) + shape[-1:]


def tensor_shape(tensor: gguf.ReaderTensor) -> tuple[int, ...]:
    """(out, in) for a matrix: GGUF lists dimensions innermost first."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def rotary_unpermutation(rows: int, heads: int) -> torch.Tensor:
    """Row index that turns llama.cpp's q/k row order back into Hugging Face's.

    Within a head of size d, llama.cpp stores HF row j * d/2 + i (half j, pair i) at 2i + j.
    """
    half = rows // heads // 2
    return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(rows)


# Decoding


def _decode(data: np.ndarray, kind: QType, shape: tuple[int, ...], quantization: str,
            dtype: torch.dtype) -> Weight:
    """data: a tensor's raw rows as GGUFReader gives them (values, or bytes of blocks)."""
    if quantization == "none":
        return dequantize_to_float(data, kind, shape).to(dtype)
    if len(shape) == 1:
        return dequantize_to_float(data, kind, shape)  # norms and biases: float32
    if kind in INT4_TYPES:
        return decode_int4(data, kind)
    if kind == QType.Q8_0:
        return decode_q8_0(data)
    if kind in BLOCK_WEIGHTS:  # read in place by our CPU kernel; widened where that does not run
        return BLOCK_WEIGHTS[kind](blocks_in_huge_pages(data))
    if kind in DECODED_TYPES:  # exactly, or in groups of 32 finer than their own steps
        return widen_to_int8(data, kind)
    return _float_tensor(data, kind, shape).to(dtype)


def _decode_expert(rows: np.ndarray, kind: QType, shape: tuple[int, ...], quantization: str,
                   dtype: torch.dtype) -> Weight:
    """One expert's matrix from its rows in the file's 3-D tensor (a view of the memory map):
    blocks stay there, read in place (`expert_weight`: a 30B-A3B's experts are most of its
    18 GB), other types are decoded as any matrix."""
    if quantization != "none" and kind.name in IN_PLACE_EXPERT_TYPES:
        return expert_weight(rows, kind)
    return _decode(rows, kind, shape, quantization, dtype)


def _norm_less_one(data: np.ndarray, kind: QType, shape: tuple[int, ...]) -> torch.Tensor:
    """A Gemma norm the converter wrote as 1 + w, as Hugging Face's w: in float64, where
    subtracting 1 is exact, so that the model's own 1 + w (pagoda.engine.models.decoder) gives back the
    file's values to the bit."""
    return dequantize_to_float(data, kind, shape).double() - 1


def dequantize_to_float(data: np.ndarray, kind: QType, shape: tuple[int, ...]) -> torch.Tensor:
    """float32: the types without a kernel by our own decoding, others by gguf-py's."""
    if kind in DECODED_TYPES:
        return torch.from_numpy(dequantize_rows(data, kind)).reshape(shape)
    values = gguf.quants.dequantize(data, kind)
    if not values.flags.writeable:  # a view of the read-only memory map (F32)
        values = values.copy()
    return torch.from_numpy(values).reshape(shape)


def _float_tensor(data: np.ndarray, kind: QType, shape: tuple[int, ...]) -> torch.Tensor:
    if kind == QType.BF16:
        return torch.from_numpy(np.array(data).view(np.int16)).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(np.array(data)).reshape(shape)


def decode_int4(data: np.ndarray, kind: QType) -> Int4Weight:
    """Raw Q4_0/Q4_1/Q4_K rows [N, bytes per row] -> the exact Int4Weight of the same values."""
    type_size = gguf.GGML_QUANT_SIZES[kind][1]
    rows = data.shape[0]
    blocks = np.asarray(data).reshape(rows, -1, type_size)
    if kind == QType.Q4_0:
        d = fp16_field(blocks, 0)
        scales, mins, packed = d, -8 * d, _repack_nibbles(blocks[..., 2:])
    elif kind == QType.Q4_1:
        scales, mins = fp16_field(blocks, 0), fp16_field(blocks, 2)
        packed = _repack_nibbles(blocks[..., 4:])
    else:
        scales, mins, packed = _q4_k_parts(blocks)
    return Int4Weight(
        packed=torch.from_numpy(packed.reshape(rows, -1)),
        scales=torch.from_numpy(scales.reshape(rows, -1)),
        mins=torch.from_numpy(mins.reshape(rows, -1)),
        group_size=INT4_GROUP_SIZE,
    )


def blocks_in_huge_pages(data: np.ndarray) -> torch.Tensor:
    """A tensor's rows of GGUF blocks, copied out of the file's mapping into huge pages: a
    one-row step streams them from memory (pagoda/kernels/cpu/huge_pages.py)."""
    out = huge_page_empty(data.shape, torch.uint8)
    np.copyto(out.numpy(), np.asarray(data).view(np.uint8))
    return out


def decode_q8_0(data: np.ndarray) -> Int8Weight:
    """Raw Q8_0 rows (blocks of an fp16 scale and 32 int8 values) -> the exact Int8Weight."""
    type_size = gguf.GGML_QUANT_SIZES[QType.Q8_0][1]
    rows = data.shape[0]
    blocks = np.asarray(data).reshape(rows, -1, type_size)
    # In huge pages: a one-row step streams the values from memory (pagoda/kernels/cpu/huge_pages.py).
    q = huge_page_empty((rows, blocks.shape[1] * 32), torch.int8)
    np.copyto(q.numpy().reshape(blocks.shape[:2] + (32,)), blocks[..., 2:].view(np.int8))
    scales = torch.from_numpy(fp16_field(blocks, 0))
    return Int8Weight(q, scales, INT8_GROUP_SIZE)


def _q4_k_parts(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_K super-block: fp16 d and dmin, 12 bytes of 6-bit sub-block scales and mins, then 4
    chunks of 32 bytes, each holding two 32-value sub-blocks (low nibbles first)."""
    d = fp16_field(blocks, 0)[..., None]
    dmin = fp16_field(blocks, 2)[..., None]
    sub_scales, sub_mins = k_quant_scales_and_mins(blocks[..., 4:16])
    chunks = blocks[..., 16:].reshape(*blocks.shape[:2], 4, 32)
    return d * sub_scales, -(dmin * sub_mins), _repack_nibbles(chunks)


def _repack_nibbles(qs: np.ndarray) -> np.ndarray:
    """GGUF keeps a group's first half in the low nibbles of its n bytes and the second half in
    the high nibbles; Int4Weight keeps consecutive values in byte pairs (even k low, odd k high).
    """
    even, odd = qs[..., 0::2], qs[..., 1::2]
    first_half = (even & 0x0F) | ((odd & 0x0F) << 4)
    second_half = (even >> 4) | (odd & 0xF0)
    return np.concatenate([first_half, second_half], axis=-1)


# Reading the file


class _PlainArrayReader(gguf.GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map: slicing an np.memmap runs Python
    code per slice, which made reading a 49k-token vocabulary's header take 2 s instead of 0.5.

    Arrays of strings or numbers are split into the same parts gguf-py makes, but from one scan
    of the string lengths and one view of the numbers, where gguf-py parses every item as a
    field of its own: a 262k-token vocabulary (Gemma 3) took it 16-20 s, this about a second."""

    @property
    def data(self) -> np.ndarray:
        return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain_data = value.view(np.ndarray)

    def _get_field_parts(
        self, orig_offs: int, raw_type: int,
    ) -> tuple[int, list[np.ndarray], list[int], list[gguf.GGUFValueType]]:
        if raw_type != gguf.GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        item_type, count = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        kind, start = gguf.GGUFValueType(item_type[0]), orig_offs + 12
        if count[0] == 0 or kind == gguf.GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        if kind == gguf.GGUFValueType.STRING:  # parts: each string's length, then its bytes
            items, end = self._string_parts(start, int(count[0]))
            data = list(range(3, 2 + len(items), 2))
        else:
            values = self._get(start, self.gguf_scalar_to_np[kind], count[0])
            items, end = [values[i:i + 1] for i in range(len(values))], start + values.nbytes
            data = list(range(2, 2 + len(items)))
        return end - orig_offs, [item_type, count, *items], data, [gguf.GGUFValueType.ARRAY, kind]

    def _string_parts(self, offset: int, count: int) -> tuple[list[np.ndarray], int]:
        """Each string's length (a one-item uint64 view) and bytes, as gguf-py's parts, and the
        offset after the last; check_gguf_header has bounded every length by the file's size."""
        data, buffer = self.data, memoryview(self.data)
        parts: list[np.ndarray] = []
        for _ in range(count):
            length = struct.unpack_from("=Q", buffer, offset)[0]
            parts += (data[offset:offset + 8].view(np.uint64), data[offset + 8:offset + 8 + length])
            offset += 8 + length
        return parts, offset


def open_gguf_reader(path: Path) -> gguf.GGUFReader:
    """Checked first by our bounded scan: gguf-py allocates for whatever counts the file claims."""
    try:
        check_gguf_header(path)
    except OSError as error:
        raise ModelLoadError(f"{path} cannot be read: {error}. Check the file and its "
                             "permissions.") from error
    try:
        return _PlainArrayReader(path)
    except Exception as error:  # every parse failure means the same to a user
        raise ModelLoadError(
            f"{path} is not a complete GGUF file ({type(error).__name__}: {error}). It may have "
            "been cut short, or use a tensor type newer than Pagoda's GGUF reader knows: "
            "re-download it, or choose another file."
        ) from error


# The config and tokenizer cache


def _read_cached_metadata(
    cache: Path,
) -> tuple[transformers.PretrainedConfig, transformers.PreTrainedTokenizerBase] | None:
    if not (cache / "config.json").is_file():
        return None
    try:
        config = transformers.AutoConfig.from_pretrained(cache)
        tokenizer = transformers.AutoTokenizer.from_pretrained(cache)
    except Exception as error:  # noqa: BLE001 - a damaged cache is rebuilt, never fatal
        logger.warning("Ignoring the damaged tokenizer cache %s (%s); rebuilding it", cache, error)
        return None
    return config, tokenizer


def _write_cached_metadata(cache: Path, config: transformers.PretrainedConfig,
                           tokenizer: transformers.PreTrainedTokenizerBase) -> None:
    """Write into a fresh folder and rename it into place: a reader sees all of it or none."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{cache.name}.partial-", dir=cache.parent))
    except OSError as error:
        logger.warning("Cannot cache the tokenizer in %s: %s", cache.parent, error)
        return
    try:
        config.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(partial, cache)
    except OSError as error:
        # Another process may have put its copy in place first; either way loading goes on.
        logger.warning("Could not cache the tokenizer in %s: %s", cache, error)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
