"""Tiny GGUF files, written with gguf-py the way llama.cpp's converter writes real ones.

    model = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q4_K)
    model.path, model.source["model.layers.0.self_attn.q_proj.weight"]

Matrices are stored in matrix_type (1-D norms and biases in F32). Types gguf-py can quantize are
quantized from random float weights; K-quants and IQ types, which it cannot, are random raw
blocks with small fp16 scales. `source` holds the float weights in Hugging Face's row order (for
random raw blocks: None). As llama.cpp does, llama q and k rows are stored permuted.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType
from transformers.convert_slow_tokenizer import bytes_to_unicode

HIDDEN = 256  # K-quant super-blocks are 256 values long
INTERMEDIATE = 512
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
LAYERS = 2
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Byte offsets of the fp16 scales inside a block of each K-quant and IQ type (IQ1_M spreads its
# one scale over four nibbles: `_set_iq1_m_scale`).
_FP16_FIELDS = {QType.Q4_K: (0, 2), QType.Q5_K: (0, 2), QType.Q6_K: (208,),
                QType.Q2_K: (80, 82), QType.Q3_K: (108,), QType.IQ4_NL: (0,),
                QType.IQ4_XS: (0,), QType.IQ2_XXS: (0,), QType.IQ2_XS: (0,), QType.IQ2_S: (0,),
                QType.IQ3_XXS: (0,), QType.IQ3_S: (0,), QType.IQ1_S: (0,), QType.IQ1_M: ()}
_RANDOM_BLOCK_TYPES = frozenset(_FP16_FIELDS)
# Their range, for weights of about 0.05: Q6_K's d multiplies an int8 sub-scale (where the
# others' take six bits) times a value of up to 32; IQ4's d a level of up to 127 (IQ4_XS's also a
# six-bit scale); IQ3's d a grid value of up to 62 (IQ3_XXS) or 15 times up to 31 (IQ3_S).
_FP16_RANGE = {QType.Q6_K: (6e-5, 2.5e-4), QType.IQ4_NL: (2e-4, 8e-4),
               QType.IQ4_XS: (1e-5, 4e-5), QType.IQ3_XXS: (2e-4, 8e-4),
               QType.IQ3_S: (1e-4, 4e-4), QType.IQ1_M: (1e-3, 4e-3)}


@dataclass(slots=True)
class TinyGGUF:
    path: Path
    source: dict[str, np.ndarray | None] = field(default_factory=dict)


def write_tiny_gguf(path: Path, architecture: str = "llama", matrix_type: QType = QType.F32,
                    skip: tuple[str, ...] = (), name: str = "tiny", seed: int = 0,
                    tied: bool = True, mixed: dict[str, QType] | None = None) -> TinyGGUF:
    """skip: GGUF tensor names to leave out (a damaged file). mixed: other types for some
    matrices by their GGUF name's last but one part, as llama.cpp's mixes keep some at more
    bits (Q4_K_M: {"attn_v": Q6_K, "ffn_down": Q6_K, "token_embd": Q6_K})."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, architecture)
    _add_config(writer, architecture, name)
    _add_tokenizer(writer)
    model = TinyGGUF(Path(path))
    for gguf_name, hf_name, shape in _tensors(architecture, tied):
        if gguf_name in skip:
            continue
        kind = (mixed or {}).get(gguf_name.split(".")[-2], matrix_type)
        kind = kind if len(shape) == 2 else QType.F32
        values = None if kind in _RANDOM_BLOCK_TYPES else _random_weight(hf_name, shape, rng)
        model.source[hf_name] = values
        stored = values if values is None else _llama_cpp_row_order(architecture, hf_name, values)
        _add_tensor(writer, gguf_name, stored, shape, kind, rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def tensor_names(architecture: str = "llama", tied: bool = True) -> tuple[str, ...]:
    """The GGUF names of every tensor a tiny file holds (skip them all: a file of no weights)."""
    return tuple(name for name, _hf_name, _shape in _tensors(architecture, tied))


def permute_like_llama_cpp(w: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's row j * d/2 + i of a head (half j, pair i) goes to row 2i + j."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_blocks(kind: QType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw blocks [rows, bytes]: random bits, with every fp16 scale small and positive. In
    Q4_K, as llama.cpp's quantizer leaves them, each super-block's largest six-bit sub-scale
    and sub-min is 63 (d and dmin are the largest / 63): here its first scale and second min."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, size=(rows, cols // block_size, type_size), dtype=np.uint8)
    for offset in _FP16_FIELDS[kind]:
        low, high = _FP16_RANGE.get(kind, (1e-3, 4e-3))
        scales = rng.uniform(low, high, size=blocks.shape[:2]).astype(np.float16)
        blocks[..., offset:offset + 2] = scales[..., None].view(np.uint8)
    if kind == QType.Q4_K:
        blocks[..., 4] |= 0x3F  # scale 0's six bits
        blocks[..., 9] |= 0x3F  # min 1's six bits
    if kind == QType.IQ1_M:
        _set_iq1_m_scale(blocks, rng.uniform(*_FP16_RANGE[kind], size=blocks.shape[:2]))
    return blocks.reshape(rows, -1)


def _set_iq1_m_scale(blocks: np.ndarray, scales: np.ndarray) -> None:
    """IQ1_M keeps its fp16 scale in the top nibbles of its last four uint16, lowest first."""
    bits = scales.astype(np.float16).view(np.uint16)
    for k in range(4):
        top = ((bits >> (4 * k)) & 0x0F).astype(np.uint8) << 4
        blocks[..., 49 + 2 * k] = (blocks[..., 49 + 2 * k] & 0x0F) | top


def _add_config(writer: gguf.GGUFWriter, architecture: str, name: str) -> None:
    writer.add_name(name)
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_vocab_size(len(_vocabulary()))


def _vocabulary() -> list[str]:
    return [*SPECIAL_TOKENS, *bytes_to_unicode().values(), "Ġt"]


def _add_tokenizer(writer: gguf.GGUFWriter) -> None:
    tokens = _vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])
    writer.add_token_merges(["Ġ t"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)


def _tensors(architecture: str, tied: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    vocab = len(_vocabulary())
    tensors = [("token_embd.weight", "model.embed_tokens.weight", (vocab, HIDDEN)),
               ("output_norm.weight", "model.norm.weight", (HIDDEN,))]
    if not tied:
        tensors.append(("output.weight", "lm_head.weight", (vocab, HIDDEN)))
    kv = KV_HEADS * HEAD_DIM
    per_layer = [
        ("attn_q", "self_attn.q_proj", (HIDDEN, HIDDEN)), ("attn_k", "self_attn.k_proj", (kv, HIDDEN)),
        ("attn_v", "self_attn.v_proj", (kv, HIDDEN)),
        ("attn_output", "self_attn.o_proj", (HIDDEN, HIDDEN)),
        ("ffn_gate", "mlp.gate_proj", (INTERMEDIATE, HIDDEN)),
        ("ffn_up", "mlp.up_proj", (INTERMEDIATE, HIDDEN)),
        ("ffn_down", "mlp.down_proj", (HIDDEN, INTERMEDIATE)),
        ("attn_norm", "input_layernorm", (HIDDEN,)), ("ffn_norm", "post_attention_layernorm", (HIDDEN,)),
    ]
    if architecture == "qwen2":
        per_layer += [("attn_q", "self_attn.q_proj", (HIDDEN,)), ("attn_k", "self_attn.k_proj", (kv,)),
                      ("attn_v", "self_attn.v_proj", (kv,))]
    if architecture == "qwen3":
        per_layer += [("attn_q_norm", "self_attn.q_norm", (HEAD_DIM,)),
                      ("attn_k_norm", "self_attn.k_norm", (HEAD_DIM,))]
    for i in range(LAYERS):
        for gguf_module, hf_module, shape in per_layer:
            kind = "weight" if len(shape) == 2 or "norm" in gguf_module else "bias"
            tensors.append((f"blk.{i}.{gguf_module}.{kind}", f"model.layers.{i}.{hf_module}.{kind}",
                            shape))
    return tensors


def _random_weight(hf_name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if "norm" in hf_name:
        return (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
    return (0.1 * rng.standard_normal(shape)).astype(np.float32)


def _llama_cpp_row_order(architecture: str, hf_name: str, w: np.ndarray) -> np.ndarray:
    if architecture != "llama":
        return w
    if ".q_proj." in hf_name:
        return permute_like_llama_cpp(w, HEADS)
    if ".k_proj." in hf_name:
        return permute_like_llama_cpp(w, KV_HEADS)
    return w


def _add_tensor(writer: gguf.GGUFWriter, name: str, values: np.ndarray | None,
                shape: tuple[int, ...], kind: QType, rng: np.random.Generator) -> None:
    if kind == QType.F32:
        writer.add_tensor(name, values)
    elif kind == QType.F16:
        writer.add_tensor(name, values.astype(np.float16))
    elif kind in _RANDOM_BLOCK_TYPES:
        writer.add_tensor(name, random_blocks(kind, *shape, rng), raw_dtype=kind)
    else:
        writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)


# Hand-made headers, for files gguf-py's writer would never produce (damaged or crafted ones).


def raw_gguf(keys: list[bytes] = (), tensors: list[bytes] = (), *, key_count: int | None = None,
             tensor_count: int | None = None, data: bytes = b"", version: int = 3) -> bytes:
    """A little-endian GGUF file: keys from raw_key, tensors from raw_tensor_info; the counts
    default to the lists' lengths; data goes after the tensor infos, padded to 32 bytes."""
    counts = (len(tensors) if tensor_count is None else tensor_count,
              len(keys) if key_count is None else key_count)
    head = b"GGUF" + struct.pack("<IQQ", version, *counts) + b"".join(keys) + b"".join(tensors)
    return head + bytes(-len(head) % 32) + data


def raw_string(text: str, length: int | None = None) -> bytes:
    encoded = text.encode()
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded


def raw_key(name: str, value_type: gguf.GGUFValueType, value: bytes) -> bytes:
    return raw_string(name) + struct.pack("<I", value_type) + value


def raw_array(item_type: gguf.GGUFValueType, count: int, items: bytes = b"") -> bytes:
    return struct.pack("<IQ", item_type, count) + items


def raw_tensor_info(name: str, dims: tuple[int, ...], kind: QType = QType.F32, offset: int = 0,
                    n_dims: int | None = None) -> bytes:
    return (raw_string(name) + struct.pack("<I", len(dims) if n_dims is None else n_dims)
            + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset))
