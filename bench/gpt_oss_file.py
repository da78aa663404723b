"""A gpt-oss-20b-shaped GGUF (`gpt-oss`) with random weights and fewer layers, its experts
quantized by llama.cpp's own tool to MXFP4 (`MXFP4_MOE`: MXFP4 experts, Q8_0 elsewhere, as the
released files hold them).

Not a test: the issue 53 bench (bench/moe_vs_llama_cpp.py) compares Pagoda's mixture-of-experts
path with llama.cpp's server on a file of the real widths (hidden 2880, 64 query heads over 8 KV
heads of 64, q/k/v/o biases and sinks, windowed and full layers in turn, 32 experts 2880 wide
with biases, 4 used a token), which no file shipped with the app has. This writes the float16
model once (its experts as the 3-D `blk.N.ffn_{gate,up,down}_exps` tensors and their biases, as
llama.cpp's converter writes them), with the bundled SmolLM2 file's tokenizer (49,152 tokens
where gpt-oss has 201,088: the vocabulary matrices are a quarter of the real ones), then runs

    llama-quantize IN.f16.gguf OUT.MXFP4_MOE.gguf MXFP4_MOE

    python bench/gpt_oss_file.py --llama-quantize PATH/llama-quantize [--dir DIR] [--layers N]

and prints the quantized file's path. Each layer holds 796M expert weights: 1.6 GB as float16,
0.42 GB as MXFP4. One layer made a 0.76 GB file in 3 minutes on the shared 2-core machine, busy;
both our engine and llama.cpp's server run it. The router's random scores spread the tokens over
the experts about evenly; the text it generates is noise.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import gguf
import numpy as np
from llama_1b_file import _copy_tokenizer

from pagoda.engine.loading.model_files import default_model_file

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2880, 64, 8, 64
EXPERTS, USED, EXPERT_WIDTH = 32, 4, 2880
WINDOW, CONTEXT, ORIGINAL_CONTEXT = 128, 131072, 4096
LAYERS = 2
NAME = "gpt-oss-20b-shaped"
_STD = 0.02


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-quantize", type=Path, required=True)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/pagoda-gpt-oss"))
    parser.add_argument("--layers", type=int, default=LAYERS)
    args = parser.parse_args(argv)
    print(quantized_file(args.dir, args.llama_quantize, args.layers))


def quantized_file(folder: Path, llama_quantize: Path, layers: int = LAYERS) -> Path:
    """The MXFP4_MOE file of `layers` layers, made (through a float16 file, deleted afterwards)
    if missing."""
    out = folder / f"{NAME}-{layers}l.MXFP4_MOE.gguf"
    if out.is_file():
        return out
    f16 = folder / f"{NAME}-{layers}l.f16.gguf"
    _write_f16(f16, layers)
    try:
        subprocess.run([str(llama_quantize), str(f16), str(out), "MXFP4_MOE"], check=True,
                       stdout=subprocess.DEVNULL)
    finally:
        f16.unlink(missing_ok=True)
    return out


def _write_f16(path: Path, layers: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = gguf.GGUFReader(default_model_file())
    vocab = len(source.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(path, "gpt-oss")
    _add_config(writer, layers)
    _copy_tokenizer(source, writer)
    tensors = _tensor_list(vocab, layers)
    for name, shape in tensors:
        dtype = np.dtype(np.float32 if _kept_float32(name) else np.float16)
        writer.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for name, shape in tensors:
        if name.endswith("norm.weight"):
            writer.write_tensor_data(np.ones(shape, dtype=np.float32))
            continue
        values = rng.standard_normal(shape, dtype=np.float32) * _STD
        writer.write_tensor_data(values if _kept_float32(name) else values.astype(np.float16))
    writer.close()


def _kept_float32(name: str) -> bool:
    """As llama.cpp's converter writes gpt-oss: norms, biases, sinks and the router in float32."""
    return not name.endswith("weight") or any(
        part in name for part in ("norm", "sinks", "ffn_gate_inp"))


def _add_config(writer: gguf.GGUFWriter, layers: int) -> None:
    writer.add_name(NAME)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_block_count(layers)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(EXPERT_WIDTH)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(150000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(32.0)
    writer.add_rope_scaling_orig_ctx_len(ORIGINAL_CONTEXT)
    writer.add_rope_scaling_yarn_beta_fast(32.0)
    writer.add_rope_scaling_yarn_beta_slow(1.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(USED)
    writer.add_sliding_window(WINDOW)
    writer.add_expert_feed_forward_length(EXPERT_WIDTH)


def _tensor_list(vocab: int, layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape outermost first); experts stacked [experts, rows, columns], their biases
    [experts, rows]."""
    tensors = [("token_embd.weight", (vocab, HIDDEN)), ("output_norm.weight", (HIDDEN,)),
               ("output.weight", (vocab, HIDDEN))]
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(layers):
        blk = f"blk.{i}"
        tensors += [(f"{blk}.attn_norm.weight", (HIDDEN,)),
                    (f"{blk}.attn_q.weight", (q, HIDDEN)), (f"{blk}.attn_q.bias", (q,)),
                    (f"{blk}.attn_k.weight", (kv, HIDDEN)), (f"{blk}.attn_k.bias", (kv,)),
                    (f"{blk}.attn_v.weight", (kv, HIDDEN)), (f"{blk}.attn_v.bias", (kv,)),
                    (f"{blk}.attn_output.weight", (HIDDEN, q)),
                    (f"{blk}.attn_output.bias", (HIDDEN,)),
                    (f"{blk}.attn_sinks.weight", (HEADS,)),
                    (f"{blk}.post_attention_norm.weight", (HIDDEN,)),
                    (f"{blk}.ffn_gate_inp.weight", (EXPERTS, HIDDEN)),
                    (f"{blk}.ffn_gate_inp.bias", (EXPERTS,))]
        for kind, rows, cols in (("gate", EXPERT_WIDTH, HIDDEN), ("up", EXPERT_WIDTH, HIDDEN),
                                 ("down", HIDDEN, EXPERT_WIDTH)):
            tensors += [(f"{blk}.ffn_{kind}_exps.weight", (EXPERTS, rows, cols)),
                        (f"{blk}.ffn_{kind}_exps.bias", (EXPERTS, rows))]
    return tensors


if __name__ == "__main__":
    main()
