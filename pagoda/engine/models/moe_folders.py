"""A mixture-of-experts folder's expert tensors under the shared names (ROUTER, EXPERTS in
pagoda/engine/models/architecture.py), for the families whose folders name them otherwise:

- Mixtral's own checkpoints: block_sparse_moe.gate, block_sparse_moe.experts.E.w1 (gate),
  w3 (up), w2 (down);
- transformers 5's layout (`save_pretrained(save_original_format=False)`): every expert of a
  layer in two 3-D tensors, mlp.experts.gate_up_proj [experts, 2 x width, hidden] (gate rows,
  then up) and mlp.experts.down_proj [experts, hidden, width]. Each expert's matrices are views
  of them, not copies.

Released Qwen2/3-MoE checkpoints (and transformers' default save) use the shared names
already.
"""

from __future__ import annotations

import re

import torch
from transformers import PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.models.architecture import EXPERTS, ROUTER

# The folder tensors `shared_names` maps (the loader reads them for it).
FOLDER_TENSORS = re.compile(
    r"model\.layers\.\d+\.(?:block_sparse_moe\.(?:gate|experts\.\d+\.w[123])\.weight"
    r"|mlp\.experts\.(?:gate_up_proj|down_proj))")
_MIXTRAL = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.(gate|experts\.\d+\.w[123])"
                      r"\.weight")
_MIXTRAL_MODULES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_FUSED = re.compile(r"(model\.layers\.\d+\.)mlp\.experts\.(gate_up_proj|down_proj)")


def folder_weights(config: PretrainedConfig,
                   tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors FOLDER_TENSORS matched, under the shared names (the family modules' hook:
    pagoda/engine/models/registry.py)."""
    named: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if mixtral := _MIXTRAL.fullmatch(name):
            named[_mixtral_name(*mixtral.groups())] = tensor
        elif fused := _FUSED.fullmatch(name):
            named |= _per_expert(name, fused.group(1), fused.group(2), tensor)
    return named


def _mixtral_name(layer: str, module: str) -> str:
    if module == "gate":
        return f"{layer}{ROUTER}.weight"
    _, expert, w = module.split(".")
    return f"{layer}{EXPERTS}.{expert}.{_MIXTRAL_MODULES[w]}.weight"


def _per_expert(name: str, layer: str, kind: str,
                tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    if tensor.ndim != 3 or (kind == "gate_up_proj" and tensor.shape[1] % 2):
        raise ModelLoadError(
            f"Tensor {name} has shape {tuple(tensor.shape)}, where transformers keeps a layer's "
            "experts as [experts, 2 x width, hidden] (gate_up_proj) or [experts, hidden, width] "
            "(down_proj). Re-download the model.")
    if kind == "down_proj":
        return {f"{layer}{EXPERTS}.{e}.down_proj.weight": matrix
                for e, matrix in enumerate(tensor)}
    width = tensor.shape[1] // 2
    named = {}
    for e, matrix in enumerate(tensor):
        named[f"{layer}{EXPERTS}.{e}.gate_proj.weight"] = matrix[:width]
        named[f"{layer}{EXPERTS}.{e}.up_proj.weight"] = matrix[width:]
    return named
