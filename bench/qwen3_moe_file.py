"""A Qwen3-30B-A3B-shaped GGUF (`qwen3moe`) with random weights and fewer layers, quantized by
llama.cpp's own tool (Q4_K_M, or the types --type names).

Not a test: the issue 53 benches compare Pagoda's mixture-of-experts path with llama.cpp's
server on one file with the real widths (hidden 2048, 32 query heads over 4 KV heads of 128,
128 experts 768 wide, 8 used a token, q/k norms, a separate output matrix), which no file
shipped with the app has. This writes the float16 model once, its experts as the 3-D
`blk.N.ffn_{gate,up,down}_exps` tensors llama.cpp's converter writes, with the bundled SmolLM2
file's tokenizer and chat template (a 49,152-token vocabulary where Qwen3's has 151,936: the
vocabulary matrices are a third of the real ones), then runs

    llama-quantize IN.f16.gguf OUT.Q4_K_M.gguf Q4_K_M

    python bench/qwen3_moe_file.py --llama-quantize PATH/llama-quantize [--dir DIR] [--layers N]

and prints the quantized file's path. Sizes at the default 4 layers: the float16 file 5.4 GB
(deleted afterwards), Q4_K_M 1.65 GB (4.90 bits a weight: Q4_K with Q6_K in some layers' down
experts, a Q6_K output matrix); each layer adds 1.25 GB and 0.38 GB. On the shared 2-core
machine, busy, it took 25 minutes (6 to write, 19 for llama-quantize). The real model's 48
layers would need a 60 GB float16 file on the way (about 18 GB as Q4_K_M). The router's
random scores spread the tokens over the experts about evenly; the text it generates is noise.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import gguf
import numpy as np
from llama_1b_file import _copy_tokenizer

from pagoda.engine.loading.model_files import default_model_file

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, USED, EXPERT_WIDTH, DENSE_WIDTH = 128, 8, 768, 6144
LAYERS = 4
NAME = "qwen3-30b-a3b-shaped"
_STD = 0.02


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-quantize", type=Path, required=True)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/pagoda-qwen3-moe"))
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--type", default="Q4_K_M", help="a llama-quantize type (default Q4_K_M)")
    args = parser.parse_args(argv)
    print(quantized_file(args.dir, args.llama_quantize, args.layers, args.type))


def quantized_file(folder: Path, llama_quantize: Path, layers: int = LAYERS,
                   kind: str = "Q4_K_M") -> Path:
    """The file of `layers` layers quantized to kind, made (through a float16 file, deleted
    afterwards) if missing."""
    out = folder / f"{NAME}-{layers}l.{kind}.gguf"
    if out.is_file():
        return out
    f16 = folder / f"{NAME}-{layers}l.f16.gguf"
    write_f16(f16, default_model_file(), layers)
    try:
        subprocess.run([str(llama_quantize), str(f16), str(out), kind], check=True,
                       stdout=subprocess.DEVNULL)
    finally:
        f16.unlink(missing_ok=True)
    return out


def write_f16(path: Path, tokenizer_source: Path, layers: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = gguf.GGUFReader(tokenizer_source)
    vocab = len(source.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(path, "qwen3moe")
    _add_config(writer, layers)
    _copy_tokenizer(source, writer)
    tensors = _tensor_list(vocab, layers)
    for name, shape in tensors:
        dtype = np.dtype(np.float32 if _kept_float32(name, shape) else np.float16)
        writer.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for name, shape in tensors:
        if len(shape) == 1:  # norms
            writer.write_tensor_data(np.ones(shape, dtype=np.float32))
            continue
        values = rng.standard_normal(shape, dtype=np.float32) * _STD
        writer.write_tensor_data(values if _kept_float32(name, shape) else values.astype(np.float16))
    writer.close()


def _kept_float32(name: str, shape: tuple[int, ...]) -> bool:
    """As llama.cpp's converter writes them: norms and the router in float32."""
    return len(shape) == 1 or name.endswith("ffn_gate_inp.weight")


def _add_config(writer: gguf.GGUFWriter, layers: int) -> None:
    writer.add_name(NAME)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_block_count(layers)
    writer.add_context_length(32768)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(DENSE_WIDTH)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(USED)
    writer.add_expert_feed_forward_length(EXPERT_WIDTH)


def _tensor_list(vocab: int, layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape outermost first); experts stacked [experts, rows, columns]."""
    tensors = [("token_embd.weight", (vocab, HIDDEN)), ("output_norm.weight", (HIDDEN,)),
               ("output.weight", (vocab, HIDDEN))]
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(layers):
        tensors += [(f"blk.{i}.attn_norm.weight", (HIDDEN,)),
                    (f"blk.{i}.attn_q.weight", (q, HIDDEN)),
                    (f"blk.{i}.attn_k.weight", (kv, HIDDEN)),
                    (f"blk.{i}.attn_v.weight", (kv, HIDDEN)),
                    (f"blk.{i}.attn_q_norm.weight", (HEAD_DIM,)),
                    (f"blk.{i}.attn_k_norm.weight", (HEAD_DIM,)),
                    (f"blk.{i}.attn_output.weight", (HIDDEN, q)),
                    (f"blk.{i}.ffn_norm.weight", (HIDDEN,)),
                    (f"blk.{i}.ffn_gate_inp.weight", (EXPERTS, HIDDEN)),
                    (f"blk.{i}.ffn_gate_exps.weight", (EXPERTS, EXPERT_WIDTH, HIDDEN)),
                    (f"blk.{i}.ffn_up_exps.weight", (EXPERTS, EXPERT_WIDTH, HIDDEN)),
                    (f"blk.{i}.ffn_down_exps.weight", (EXPERTS, HIDDEN, EXPERT_WIDTH))]
    return tensors


if __name__ == "__main__":
    main()
