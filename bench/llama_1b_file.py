"""A 1.1B Llama-shaped GGUF with random weights, quantized by llama.cpp's own tool (Q4_K_M, or
the types --type names: IQ4_XS, Q5_K_M ...).

Not a test: the benches that compare Pagoda with llama.cpp at 1B (issue 26) need a real Q4_K_M
mix (Q4_K layers with some Q6_K, as `llama-quantize` chooses them), and no such file ships with
the app. This writes the float16 model once, with TinyLlama 1.1B's shapes (22 layers, hidden
2048, intermediate 5632, 32 heads over 4 KV heads) and the bundled SmolLM2 file's tokenizer and
chat template (so text prompts and chat requests work in both servers), then runs

    llama-quantize IN.f16.gguf OUT.Q4_K_M.gguf Q4_K_M

    python bench/llama_1b_file.py --llama-quantize PATH/llama-quantize [--dir DIR] [--type T ...]

and prints the quantized files' paths. The text it generates is noise; every byte is read as in
a real model, which is all a speed bench needs.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import gguf
import numpy as np

from pagoda.engine.loading.model_files import default_model_file

LAYERS, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS = 22, 2048, 5632, 32, 4
HEAD_DIM = HIDDEN // HEADS
NAME = "llama-1b-random"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-quantize", type=Path, required=True)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/pagoda-1b"))
    parser.add_argument("--type", action="append", dest="types",
                        help="a llama-quantize type (repeatable; default Q4_K_M)")
    args = parser.parse_args(argv)
    for kind in args.types or ["Q4_K_M"]:
        print(quantized_file(args.dir, args.llama_quantize, kind))
    (args.dir / f"{NAME}.f16.gguf").unlink(missing_ok=True)


def quantized_file(folder: Path, llama_quantize: Path, kind: str = "Q4_K_M") -> Path:
    """The file quantized to kind, made (from the float16 one, written once) if missing."""
    out = folder / f"{NAME}.{kind}.gguf"
    if out.is_file():
        return out
    f16 = folder / f"{NAME}.f16.gguf"
    if not f16.is_file():
        write_f16(f16, default_model_file())
    subprocess.run([str(llama_quantize), str(f16), str(out), kind], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def write_f16(path: Path, tokenizer_source: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = gguf.GGUFReader(tokenizer_source)
    vocab = len(source.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(path, "llama")
    _add_config(writer, vocab)
    _copy_tokenizer(source, writer)
    tensors = _tensor_list(vocab)
    for name, rows, cols in tensors:
        dtype = np.float32 if rows == 1 else np.float16
        shape = (cols,) if rows == 1 else (rows, cols)
        writer.add_tensor_info(name, shape, np.dtype(dtype), rows * cols * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for _, rows, cols in tensors:
        if rows == 1:
            writer.write_tensor_data(np.ones(cols, dtype=np.float32))
        else:
            weights = rng.standard_normal((rows, cols), dtype=np.float32) * 0.02
            writer.write_tensor_data(weights.astype(np.float16))
    writer.close()


def _add_config(writer: gguf.GGUFWriter, vocab: int) -> None:
    writer.add_name(NAME)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_block_count(LAYERS)
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(vocab)


def _copy_tokenizer(source: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    for name, field in source.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub_type)


def _tensor_list(vocab: int) -> list[tuple[str, int, int]]:
    """(name, rows, cols); rows 1 marks a norm vector. The embedding is tied, as in Llama 3.2
    1B and SmolLM2: no output.weight."""
    tensors = [("token_embd.weight", vocab, HIDDEN), ("output_norm.weight", 1, HIDDEN)]
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        tensors += [(f"blk.{i}.attn_norm.weight", 1, HIDDEN),
                    (f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN),
                    (f"blk.{i}.attn_k.weight", kv, HIDDEN),
                    (f"blk.{i}.attn_v.weight", kv, HIDDEN),
                    (f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN),
                    (f"blk.{i}.ffn_norm.weight", 1, HIDDEN),
                    (f"blk.{i}.ffn_gate.weight", INTERMEDIATE, HIDDEN),
                    (f"blk.{i}.ffn_up.weight", INTERMEDIATE, HIDDEN),
                    (f"blk.{i}.ffn_down.weight", HIDDEN, INTERMEDIATE)]
    return tensors


if __name__ == "__main__":
    main()
