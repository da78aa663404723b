"""pagoda/kernels/cpu/moe_experts.c (a mixture-of-experts layer's routed experts, read in place from
GGUF blocks, one call a step) through ctypes.

Takes each expert's projections as uint8 tensors of GGUF rows (pagoda/kernels/ does not import the
engine's weight types): a layer is built once (`MoeExperts.layer`), holding the experts' row
pointers, and run each step (`MoeExperts.forward`). Built and loaded by `pagoda.kernels.cpu.native`
(which binds it to torch's OpenMP runtime).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from pagoda.kernels.cpu import native

NAME = "moe_experts"
BEST_ISA = -1
# The GGUF block types the kernel reads, by the code moe_experts.c takes, with (values a
# block, bytes a block).
TYPE_CODES = {"Q4_0": 0, "Q8_0": 1, "MXFP4": 2, "Q4_K": 3, "Q5_K": 4, "Q6_K": 5, "IQ4_XS": 6,
              "Q3_K": 7}
BLOCKS = {"Q4_0": (32, 18), "Q8_0": (32, 34), "MXFP4": (32, 17), "Q4_K": (256, 144),
          "Q5_K": (256, 176), "Q6_K": (256, 210), "IQ4_XS": (256, 136), "Q3_K": (256, 110)}
# The activations between gate/up and down.
ACTIVATIONS = {"silu": 0, "swiglu_oai": 1}
_ALIGN = 64


class _Layer(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_int) for name in
                  ("hidden", "inter", "num_experts", "top_k", "gate_type", "up_type",
                   "down_type", "activation")),
                ("limit", ctypes.c_float), ("alpha", ctypes.c_float),
                *((name, ctypes.c_void_p) for name in
                  ("gate", "up", "down", "gate_bias", "up_bias", "down_bias"))]


@dataclass(slots=True, frozen=True)
class Projection:
    """One projection of every expert: uint8 rows of GGUF blocks of one type, an expert's
    [out, in / values a block * bytes a block] each, and optional fp32 biases [out] each."""

    rows: list[torch.Tensor]
    type_name: str
    biases: list[torch.Tensor] | None = None


@dataclass(slots=True, frozen=True)
class CExperts:
    """A layer's experts as a C caller runs them (decode_ops.c's one-call step): moe_forward's
    address, the layer's struct moe_layer (its top_k set) and the workspace bytes a call of m
    rows needs. Valid while the MoeLayer and the library live."""

    fn: int
    layer: int
    workspace_bytes: int


class MoeLayer:
    """One layer's experts as the kernel reads them: the C structure and the pointer arrays
    it points into, kept alive with the tensors they address."""

    __slots__ = ("_arrays", "_tensors", "hidden", "struct")

    def __init__(self, struct: _Layer, arrays: list, tensors: list[torch.Tensor]) -> None:
        self.struct = struct
        self.hidden = struct.hidden
        self._arrays = arrays
        self._tensors = tensors


class MoeExperts:
    """The loaded library, with tensor-level calls. Tensors must be CPU ones."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        ptr, i32 = ctypes.c_void_p, ctypes.c_int
        signatures = {
            "moe_best_isa": ([], i32),
            "moe_isa_supported": ([i32], i32),
            "moe_workspace_bytes": ([ptr, i32], ctypes.c_size_t),
            "moe_forward": ([i32, ptr, ptr, i32, ptr, ptr, ptr, ptr, i32], i32),
            "moe_linear_workspace_bytes": ([i32, i32], ctypes.c_size_t),
            "moe_linear": ([i32, i32, ptr, i32, i32, ptr, i32, ptr, ptr], i32),
            "moe_quantize_rows": ([i32, i32, ptr, i32, i32, ptr, ptr, ptr], i32),
        }
        for name, (args, result) in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, result

    @classmethod
    def load(cls, build_dir: Path | None, compiler: str | None = None) -> MoeExperts:
        """Raises native.NativeBuildError where the library can be neither found nor built."""
        return cls(native.load(NAME, build_dir, compiler))

    def best_isa(self) -> int:
        return self._lib.moe_best_isa()

    def isa_supported(self, isa: int) -> bool:
        return bool(self._lib.moe_isa_supported(isa))

    def layer(self, gate: Projection, up: Projection, down: Projection,
              activation: str = "silu", limit: float = 0.0, alpha: float = 0.0) -> MoeLayer:
        """The experts of one layer; activation "silu" or "swiglu_oai" (gpt-oss's, clamped
        at limit, sigmoid(alpha g)). Raises ValueError for shapes, types or layouts the kernel
        cannot read in place."""
        experts = len(gate.rows)
        if not experts or len(up.rows) != experts or len(down.rows) != experts:
            raise ValueError("gate, up and down need one weight per expert each "
                             f"({len(gate.rows)}, {len(up.rows)}, {len(down.rows)} given)")
        if (BLOCKS[gate.type_name][0] != BLOCKS[up.type_name][0]
                or (gate.type_name == "MXFP4") != (up.type_name == "MXFP4")):
            raise ValueError(f"gate ({gate.type_name}) and up ({up.type_name}) read one "
                             "quantization of x: both blocks of 32 or both super-blocks, "
                             "both MXFP4 (its own layout) or neither")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is none of {', '.join(ACTIVATIONS)}")
        inter, hidden = _width(gate, None), _width(down, None)
        _width(gate, (inter, hidden))
        _width(up, (inter, hidden))
        _width(down, (hidden, inter))
        arrays, tensors = [], []
        fields = {}
        for name, projection in (("gate", gate), ("up", up), ("down", down)):
            fields[name] = _pointers(projection.rows, arrays, tensors)
            bias = None
            if projection.biases is not None:
                out = inter if name != "down" else hidden
                biases = [b.float().contiguous() for b in projection.biases]
                if len(biases) != experts or any(tuple(b.shape) != (out,) for b in biases):
                    raise ValueError(f"{name} biases must be {experts} vectors of {out}")
                bias = _pointers(biases, arrays, tensors)
            fields[f"{name}_bias"] = bias
        struct = _Layer(hidden, inter, experts, 1, TYPE_CODES[gate.type_name],
                        TYPE_CODES[up.type_name], TYPE_CODES[down.type_name],
                        ACTIVATIONS[activation], limit, alpha, **fields)
        return MoeLayer(struct, arrays, tensors)

    def workspace_bytes(self, layer: MoeLayer, m: int, top_k: int) -> int:
        layer.struct.top_k = top_k
        return self._lib.moe_workspace_bytes(ctypes.byref(layer.struct), m)

    def c_experts(self, layer: MoeLayer, m: int, top_k: int) -> CExperts:
        """The layer's C entry for steps of m rows routed to top_k experts each (the struct's
        top_k is set to it, as workspace_bytes does)."""
        work = self.workspace_bytes(layer, m, top_k)
        fn = ctypes.cast(self._lib.moe_forward, ctypes.c_void_p).value
        return CExperts(fn, ctypes.addressof(layer.struct), work)

    def forward(self, layer: MoeLayer, x: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor, isa: int = BEST_ISA, threads: int = 1,
                work: torch.Tensor | None = None, out: torch.Tensor | None = None,
                ) -> torch.Tensor:
        """The routed experts' sum for x fp32 [m, hidden], topk_ids int64 and topk_weights
        fp32 [m, top_k]; work: at least workspace_bytes(layer, m) + 64 bytes of uint8 (made
        here if None), out fp32 [m, hidden] (likewise)."""
        m, top_k = x.shape[0], topk_ids.shape[-1]
        if (x.dtype != torch.float32 or tuple(x.shape) != (m, layer.hidden)
                or not x.is_contiguous()):
            raise ValueError(f"x must be contiguous float32 [m, {layer.hidden}]")
        for name, t, dtype in (("topk_ids", topk_ids, torch.int64),
                               ("topk_weights", topk_weights, torch.float32)):
            if t.dtype != dtype or tuple(t.shape) != (m, top_k) or not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous {dtype} [{m}, {top_k}]")
        if not m:  # a step with no rows: the C call takes none
            return torch.empty(0, layer.hidden)
        needed = self.workspace_bytes(layer, m, top_k) + _ALIGN
        if work is None or work.numel() < needed:
            work = torch.empty(needed, dtype=torch.uint8)
        if out is None:
            out = torch.empty(m, layer.hidden)
        aligned = -work.data_ptr() % _ALIGN
        rc = self._lib.moe_forward(isa, ctypes.byref(layer.struct), x.data_ptr(), m,
                                   topk_ids.data_ptr(), topk_weights.data_ptr(), out.data_ptr(),
                                   work.data_ptr() + aligned, threads)
        if rc:
            raise ValueError("moe_forward refused its arguments (an expert id out of range, "
                             "top_k above the expert count, or an instruction set this CPU "
                             "lacks)")
        return out


    def linear(self, rows: torch.Tensor, type_name: str, x: torch.Tensor,
               isa: int = BEST_ISA) -> torch.Tensor:
        """One projection as `forward` runs each: x fp32 [m, k] quantized inside, times rows
        (uint8 GGUF blocks [n, .]); one thread."""
        n, m, k = rows.shape[0], x.shape[0], x.shape[1]
        _width(Projection([rows], type_name), (n, k))
        x = x.float().contiguous()
        y = torch.empty(m, n)
        work = torch.empty(self._lib.moe_linear_workspace_bytes(m, k) + _ALIGN, dtype=torch.uint8)
        aligned = -work.data_ptr() % _ALIGN
        if self._lib.moe_linear(isa, TYPE_CODES[type_name], rows.data_ptr(), n, k, x.data_ptr(),
                                m, y.data_ptr(), work.data_ptr() + aligned):
            raise ValueError("moe_linear refused its arguments")
        return y

    def quantize_rows(self, x: torch.Tensor, type_name: str, isa: int = BEST_ISA,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x fp32 [m, k] as the kernel quantizes it for weights of type_name: int8 [m, k], the
        block scales and sums fp32 [m, k / 32] (per 256 values for the K-quants and IQ4_XS,
        the scale repeated in its 8 blocks' entries)."""
        x = x.float().contiguous()
        m, k = x.shape
        xq = torch.empty(m, k, dtype=torch.int8)
        scale, total = torch.empty(m, k // 32), torch.empty(m, k // 32)
        if self._lib.moe_quantize_rows(isa, TYPE_CODES[type_name], x.data_ptr(), m, k,
                                       xq.data_ptr(), scale.data_ptr(), total.data_ptr()):
            raise ValueError(f"moe_quantize_rows refused a width of {k} for {type_name}")
        return xq, scale, total


def _width(projection: Projection, shape: tuple[int, int] | None) -> int:
    """Checks every expert's rows against shape (out, in); with None, returns the first one's
    out."""
    if projection.type_name not in BLOCKS:
        raise ValueError(f"moe_experts reads {', '.join(BLOCKS)} blocks, not "
                         f"{projection.type_name}")
    values, size = BLOCKS[projection.type_name]
    if shape is None:
        return projection.rows[0].shape[0]
    out, inp = shape
    want = (out, inp // values * size)
    for rows in projection.rows:
        if (rows.dtype != torch.uint8 or tuple(rows.shape) != want or inp % values
                or not rows.is_contiguous()):
            raise ValueError(f"each expert's {projection.type_name} rows must be contiguous "
                             f"uint8 {list(want)} ([{out}, {inp}] values), not {rows.dtype} "
                             f"{tuple(rows.shape)}")
    return out


def _pointers(tensors: list[torch.Tensor], arrays: list, kept: list[torch.Tensor]) -> int:
    array = (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))
    arrays.append(array)
    kept.extend(tensors)
    return ctypes.addressof(array)
