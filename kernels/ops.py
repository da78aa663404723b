"""The one dispatch point for kernels: Triton on CUDA tensors (issue 5), torch elsewhere."""

from __future__ import annotations

from kernels import torch_ref

rms_norm = torch_ref.rms_norm
add_rms_norm = torch_ref.add_rms_norm
rotary_embedding = torch_ref.rotary_embedding
silu_and_mul = torch_ref.silu_and_mul
write_kv_cache = torch_ref.write_kv_cache
paged_attention = torch_ref.paged_attention
