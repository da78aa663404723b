"""A mixture-of-experts GGUF file's expert weights, kept where the file holds them.

A file's `blk.N.ffn_{gate,up,down}_exps.weight` is one 3-D tensor [experts, rows, row bytes]; the
loader hands each expert's slice to `expert_weight`, which wraps it without a copy: a 30B-A3B
Q4_K_M (about 18 GB) then opens on a 24 GB machine with the experts resident only as the file's
pages, read from the mapping by pagoda/kernels/cpu/moe_experts.c (`pagoda.engine.quantization.cpu_experts`).
Where that kernel does not run (a GPU, no compiler), `GGUFRows.decoded()` gives the engine's
usual layout of the same values, which the ordinary linear methods take.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.quantization.tensors import GGUF_BLOCKS, GGUFRows

# The GGUF block types `expert_weight` keeps in place (by name).
IN_PLACE_EXPERT_TYPES = frozenset(GGUF_BLOCKS)


def expert_weight(raw_rows: np.ndarray | torch.Tensor, kind: object) -> GGUFRows:
    """One expert's matrix as the file stores it, without a copy.

    raw_rows: its rows of blocks, uint8 [rows, bytes a row], C-contiguous: a slice of
    `gguf.ReaderTensor.data` (`tensor.data[e]` of an `ffn_*_exps` tensor), which is a view of
    the file's read-only memory map, or a tensor. kind: the tensor's type, a
    `gguf.GGMLQuantizationType` or its name, one of IN_PLACE_EXPERT_TYPES (other types: decode
    them as the loader decodes any matrix). The result's `blocks` share raw_rows' memory.
    Raises ModelLoadError for rows that are not whole blocks of that type.
    """
    type_name = getattr(kind, "name", kind)
    if type_name not in GGUF_BLOCKS:
        raise ModelLoadError(f"expert weights of type {type_name} are not read in place (those "
                             f"read so: {', '.join(sorted(GGUF_BLOCKS))})")
    blocks = raw_rows if isinstance(raw_rows, torch.Tensor) else _tensor_view(raw_rows)
    size = GGUF_BLOCKS[type_name][1]
    if (blocks.dtype != torch.uint8 or blocks.dim() != 2 or not blocks.is_contiguous()
            or blocks.shape[1] == 0 or blocks.shape[1] % size):
        raise ModelLoadError(f"an expert's {type_name} rows must be whole {size}-byte blocks "
                             f"(contiguous uint8 [rows, bytes]), not {blocks.dtype} "
                             f"{tuple(blocks.shape)}: the file is damaged, re-download it")
    return GGUFRows(blocks, type_name)


def _tensor_view(rows: np.ndarray) -> torch.Tensor:
    """The array's memory as a tensor. A file's map is read-only, which torch warns of (it
    cannot mark a tensor read-only); nothing writes to weights."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(rows)
