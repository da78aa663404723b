"""GGUF files of a mixture-of-experts shape whose header is real and whose tensor data is a hole.

    path = write_moe_header_gguf(tmp_path / "a3b.gguf", QWEN3_30B_A3B)

The header (keys and tensor infos) is written by gguf-py as llama.cpp's converter writes it; the
tensors' bytes never are: the file is extended to its full length, which the file system keeps
sparse, so a 17 GB 30B-A3B-shaped file costs a few kilobytes of disk. For code that reads headers
only (sizes, parameter counts, the memory estimate): its weights read as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType


@dataclass(frozen=True, slots=True)
class MoEShape:
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    used: int
    expert_width: int
    vocab: int
    matrix_type: QType = QType.Q4_K
    output_type: QType = QType.Q6_K


# Qwen3-30B-A3B at its real widths and depth (its config.json): 30.5B parameters, 3.3B active.
QWEN3_30B_A3B = MoEShape("qwen3moe", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                         experts=128, used=8, expert_width=768, vocab=151936)
# Mixtral-shaped and small: a llama file with 8 experts, 2 a token.
TINY_MIXTRAL = MoEShape("llama", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
                        experts=8, used=2, expert_width=512, vocab=1024)


def write_moe_header_gguf(path: Path, shape: MoEShape, expert_type: QType | None = None,
                          routing_keys: bool = True) -> Path:
    """expert_type: the experts' block type (default: shape.matrix_type). routing_keys: False
    leaves out expert_count and expert_used_count (a damaged file)."""
    writer = gguf.GGUFWriter(path, shape.architecture)
    _add_keys(writer, shape, routing_keys)
    for name, dims, kind in _tensors(shape, expert_type or shape.matrix_type):
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        nbytes = int(np.prod(dims)) * block_bytes // block
        writer.add_tensor_info(name, dims, np.float32, nbytes, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    data_start = _padded(writer.fout[0].tell(), writer.data_alignment)
    data_bytes = sum(_padded(info.nbytes, writer.data_alignment)
                     for info in writer.tensors[0].values())
    writer.fout[0].truncate(data_start + data_bytes)  # a hole: no block is written
    writer.close()
    return path


def _add_keys(writer: gguf.GGUFWriter, s: MoEShape, routing_keys: bool) -> None:
    writer.add_name("moe-header")
    writer.add_block_count(s.layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(s.hidden)
    if s.architecture == "llama":  # Mixtral: its experts are feed_forward_length wide
        writer.add_feed_forward_length(s.expert_width)
    else:
        writer.add_feed_forward_length(6144)
        writer.add_expert_feed_forward_length(s.expert_width)
    if routing_keys:
        writer.add_expert_count(s.experts)
        writer.add_expert_used_count(s.used)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_rope_dimension_count(s.head_dim)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(s.vocab)


def _tensors(s: MoEShape, expert_type: QType) -> list[tuple[str, tuple[int, ...], QType]]:
    """(GGUF name, shape in Hugging Face's order: rows first, experts first, type)."""
    matrix, norm = s.matrix_type, QType.F32
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    tensors = [("token_embd.weight", (s.vocab, s.hidden), matrix),
               ("output_norm.weight", (s.hidden,), norm),
               ("output.weight", (s.vocab, s.hidden), s.output_type)]
    for i in range(s.layers):
        blk = f"blk.{i}"
        tensors += [(f"{blk}.attn_norm.weight", (s.hidden,), norm),
                    (f"{blk}.attn_q.weight", (q, s.hidden), matrix),
                    (f"{blk}.attn_k.weight", (kv, s.hidden), matrix),
                    (f"{blk}.attn_v.weight", (kv, s.hidden), matrix),
                    (f"{blk}.attn_output.weight", (s.hidden, q), matrix),
                    (f"{blk}.ffn_norm.weight", (s.hidden,), norm),
                    (f"{blk}.ffn_gate_inp.weight", (s.experts, s.hidden), norm),
                    (f"{blk}.ffn_gate_exps.weight", (s.experts, s.expert_width, s.hidden),
                     expert_type),
                    (f"{blk}.ffn_up_exps.weight", (s.experts, s.expert_width, s.hidden),
                     expert_type),
                    (f"{blk}.ffn_down_exps.weight", (s.experts, s.hidden, s.expert_width),
                     expert_type)]
        if s.architecture == "qwen3moe":
            tensors += [(f"{blk}.attn_q_norm.weight", (s.head_dim,), norm),
                        (f"{blk}.attn_k_norm.weight", (s.head_dim,), norm)]
    return tensors


def _padded(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment
