"""What a kernel backend provides (`KernelOps`), and the torch reference backend every device has.

pagoda/kernels/ops.py chooses among the backends; the backends (Triton, our C decode ops on CPU) build
their `KernelOps` from this module, so none of them imports the dispatch point.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagoda.kernels import recurrent_steps, torch_ref


@dataclass(frozen=True, slots=True)
class KernelOps:
    """One backend's kernels. `name` tells the model runner which attention metadata to build:
    decode groups and prefill segments for "torch", the flat varlen layout for "triton"."""

    name: str
    rms_norm: Callable[..., torch.Tensor]
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rotary_embedding: Callable[..., torch.Tensor]
    silu_and_mul: Callable[..., torch.Tensor]
    write_kv_cache: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]
    int4_linear: Callable[..., torch.Tensor]
    int8_linear: Callable[..., torch.Tensor]
    # A decode step's whole layer stack in one call where the backend has it
    # (pagoda/kernels/cpu/decode_layers.py; pagoda/engine/models/native_decode.py drives it).
    decode_layers: object | None = None
    # Each row's indices of its k largest values, as a set (the vocabulary's candidates).
    top_k_indices: Callable[..., torch.Tensor] = torch_ref.top_k_indices
    # Each row's argmax (the first of equal largest values; NaN largest): greedy sampling.
    row_argmax: Callable[[torch.Tensor], torch.Tensor] = torch_ref.row_argmax
    gelu_tanh_and_mul: Callable[..., torch.Tensor] = torch_ref.gelu_tanh_and_mul
    # A mixture-of-experts router on a float weight, and a shared expert's sigmoid gate.
    route: Callable[..., tuple[torch.Tensor, torch.Tensor]] = torch_ref.route
    add_sigmoid_gated: Callable[..., torch.Tensor] = torch_ref.add_sigmoid_gated
    # A gated attention's output times sigmoid(gate).
    sigmoid_mul: Callable[..., torch.Tensor] = torch_ref.sigmoid_mul
    # A Gated DeltaNet's decode rows between its in_proj and out_proj, where the backend has
    # them fused (decode_ops.c on CPU); None, or a call that returns None, runs the layer's
    # own torch path.
    gated_delta_decode: Callable[..., torch.Tensor | None] | None = None
    # LFM2's short convolution's decode rows between its two linears, likewise.
    short_conv_decode: Callable[..., torch.Tensor | None] | None = None
    # A Mamba-2's decode rows between its two linears, likewise.
    mamba2_decode: Callable[..., torch.Tensor | None] | None = None
    # The recurrent layers' one-token state updates over a table of state slots
    # (pagoda/kernels/recurrent_steps.py; fused in C on CPU: pagoda/kernels/cpu/recurrent_steps.c).
    gdn_step: Callable[..., torch.Tensor] = recurrent_steps.gdn_step
    mamba2_step: Callable[..., torch.Tensor] = recurrent_steps.mamba2_step


TORCH_OPS = KernelOps(
    name="torch",
    rms_norm=torch_ref.rms_norm,
    add_rms_norm=torch_ref.add_rms_norm,
    rotary_embedding=torch_ref.rotary_embedding,
    silu_and_mul=torch_ref.silu_and_mul,
    write_kv_cache=torch_ref.write_kv_cache,
    paged_attention=torch_ref.paged_attention,
    int4_linear=torch_ref.int4_linear,
    int8_linear=torch_ref.int8_linear,
)
