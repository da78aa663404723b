"""Tiny mixture-of-experts GGUF files, written with gguf-py as llama.cpp's converter lays them out:
Qwen3-MoE (`qwen3moe`), Qwen2-MoE with its gated shared expert (`qwen2moe`) and gpt-oss
(`gpt-oss`: sinks, q/k/v/o and expert biases, a router bias, every other layer windowed).

    path = write_tiny_moe_gguf(tmp_path / "tiny.gguf", "qwen2moe")

Every tensor the family's config names is written, each expert's matrices stacked into the file's
3-D ffn_{gate,up,down}_exps tensors; matrices in matrix_type, experts in expert_type (both Q8_0 by
default: our C kernels read them in place), routers, shared expert gates, norms, biases and sinks
in F32. dense_layers: layers given a dense MLP besides their experts (a Qwen folder's
mlp_only_layers, which no qwen3moe file states): the test that loads such a file gives the
engine that config (`moe_config`), which reads the dense MLP and leaves the experts.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType
from transformers import PretrainedConfig

from pagoda.engine.loading.gguf_names import gguf_expert_slice, gguf_tensor_name
from pagoda.engine.models.registry import expected_weight_shapes, family_for_gguf
from tests.engine.family_parity import FakeGGUFSettings
from tests.engine.tiny_gguf import _add_tokenizer, _vocabulary

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 256, 4, 2, 64, 2
EXPERTS, TOP_K, EXPERT_WIDTH, DENSE_WIDTH = 8, 2, 64, 128
WINDOW = 8  # gpt-oss's windowed layers (0, 2, ...)
_KEYS = {"block_count": LAYERS, "context_length": 512, "embedding_length": HIDDEN,
         "feed_forward_length": DENSE_WIDTH, "attention.head_count": HEADS,
         "attention.head_count_kv": KV_HEADS, "attention.key_length": HEAD_DIM,
         "attention.value_length": HEAD_DIM, "rope.freq_base": 10000.0,
         "attention.layer_norm_rms_epsilon": 1e-5, "expert_count": EXPERTS,
         "expert_used_count": TOP_K, "expert_feed_forward_length": EXPERT_WIDTH}
_ARCHITECTURE_KEYS = {"qwen3moe": {}, "qwen2moe": {"expert_shared_feed_forward_length": 96},
                      "gpt-oss": {"attention.sliding_window": WINDOW}}
_KEPT_FLOAT = ("mlp.gate.weight", "shared_expert_gate.weight")


class _Settings(FakeGGUFSettings):
    """The keys as the family reads them, with the tiny vocabulary's token table."""

    def tensor_dims(self, name: str) -> tuple[int, ...] | None:
        return (len(_vocabulary()), HIDDEN) if name == "token_embd.weight" else None


def moe_config(architecture: str, dense_layers: tuple[int, ...] = ()) -> PretrainedConfig:
    """The config the engine reads from such a file, its dense_layers made dense."""
    metadata = {f"{architecture}.{k}": v
                for k, v in (_KEYS | _ARCHITECTURE_KEYS[architecture]).items()}
    config = family_for_gguf(architecture).config_from_gguf(
        _Settings(architecture, metadata, {}))
    if dense_layers:
        config.mlp_only_layers = list(dense_layers)
    return config


def write_tiny_moe_gguf(path: Path, architecture: str, dense_layers: tuple[int, ...] = (),
                        matrix_type: QType = QType.Q8_0, expert_type: QType = QType.Q8_0,
                        seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_name("tiny moe")
    for key, value in (_KEYS | _ARCHITECTURE_KEYS[architecture]).items():
        name = f"{architecture}.{key}"
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(name, value)
    _add_tokenizer(writer)
    stacked: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
    # A dense layer keeps its experts too: a qwen3moe file has them in every layer.
    shapes = (expected_weight_shapes(moe_config(architecture))
              | expected_weight_shapes(moe_config(architecture, dense_layers)))
    for hf_name, shape in shapes.items():
        values = _random(hf_name, shape, rng)
        expert = gguf_expert_slice(hf_name, architecture)
        if expert is not None:
            stacked[expert[0]][expert[1]] = values
            continue
        kind = matrix_type if len(shape) == 2 and not hf_name.endswith(_KEPT_FLOAT) else None
        _add(writer, gguf_tensor_name(hf_name, architecture), values, kind)
    for name, experts in stacked.items():
        values = np.stack([experts[e] for e in range(len(experts))])
        _add(writer, name, values, expert_type if values.ndim == 3 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _random(hf_name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if "norm" in hf_name:
        return (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
    scale = 0.5 if hf_name.endswith(("sinks", "mlp.gate.weight")) else 0.1
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def _add(writer: gguf.GGUFWriter, name: str, values: np.ndarray, kind: QType | None) -> None:
    if kind is None:
        writer.add_tensor(name, values)
    else:
        writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
