"""A Qwen3.5-shaped dense GGUF (`qwen35`: Gated DeltaNet in three of every four layers, gated
attention in the fourth) with random weights and fewer layers, written the way users' files are
written: an HF folder through llama.cpp's own convert_hf_to_gguf.py (`--no-mtp`: transformers'
model has no multi-token-prediction head to export; with --mtp a random one is added and
exported, as the converter does by default with a released folder's), then `llama-quantize`.

Not a test: issue 56's benches compare Pagoda's hybrid path with llama.cpp's server on one file
with real widths, which no file shipped with the app has. The widths are transformers'
Qwen3_5TextConfig defaults (hidden 4096, 16 query heads over 4 KV heads of 256, a quarter of
each head rotated; Gated DeltaNet with 16 key heads and 32 value heads of 128, a 4-wide
convolution; MLP 12,288), the layers a whole number of the 3 + 1 period. The vocabulary is the
bundled SmolLM2's tokenizer (49,152 tokens where Qwen3.5's has 248,320: its two vocabulary
matrices are a fifth of the real ones' size), so llama.cpp and Pagoda read the same tokens.

    python bench/qwen35_file.py --llama-quantize PATH/llama-quantize [--dir DIR] [--layers N]
        [--type Q4_K_M] [--tiny] [--mtp]

prints the quantized file's path; the float16 folder and file are deleted afterwards. At the
default 4 layers the float16 file is 2.54 GB and the Q4_K_M 803 MB (6 minutes on the shared
2-core AMD EPYC, niced); llama-server runs it (7 tokens/s decoding there, busy). --tiny writes
a 7 MB model (hidden 64) to try the route in seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

from pagoda.engine.loading.loader import tokenizer_folder
from pagoda.engine.models.registry import optional_weight_shapes

NAME = "qwen3.5-shaped"
LAYERS = 4
PERIOD = 4  # three Gated DeltaNet layers, then one of full attention
CONVERTER = Path(sys.prefix, "share", "llama.cpp", "convert_hf_to_gguf.py")
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        # Qwen3.5's rotary sections ([11, 11, 10] by default, what the converter writes when a
        # config has none) must fit the rotated half of a head: 16 * 0.25 / 2 = 2 here.
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-quantize", type=Path, required=True)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/pagoda-qwen35"))
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--type", default="Q4_K_M", help="a llama-quantize type (default Q4_K_M)")
    parser.add_argument("--tiny", action="store_true", help="hidden 64: to try the route")
    parser.add_argument("--mtp", action="store_true",
                        help="with a random multi-token-prediction block, as the released "
                        "folders have (the converter writes it by default)")
    args = parser.parse_args(argv)
    if args.layers % PERIOD:
        parser.error(f"--layers {args.layers}: a multiple of {PERIOD} (3 linear + 1 full)")
    print(quantized_file(args.dir, args.llama_quantize, args.layers, args.type, args.tiny,
                         args.mtp))


def quantized_file(folder: Path, llama_quantize: Path, layers: int = LAYERS,
                   kind: str = "Q4_K_M", tiny: bool = False, mtp: bool = False) -> Path:
    """The file, made (HF folder -> float16 GGUF -> `kind`) if missing."""
    stem = f"{NAME}{'-tiny' if tiny else ''}-{layers}l{'-mtp' if mtp else ''}"
    out = folder / f"{stem}.{kind}.gguf"
    if out.is_file():
        return out
    hf_folder, f16 = folder / f"{stem}-hf", folder / f"{stem}.f16.gguf"
    try:
        write_hf_folder(hf_folder, layers, tiny)
        if mtp:
            write_mtp_block(hf_folder)
        subprocess.run([sys.executable, str(CONVERTER), str(hf_folder), "--outfile", str(f16),
                        "--outtype", "f16", "--model-name", stem,
                        *([] if mtp else ["--no-mtp"])], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([str(llama_quantize), str(f16), str(out), kind], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        shutil.rmtree(hf_folder, ignore_errors=True)
        f16.unlink(missing_ok=True)
    return out


def write_hf_folder(path: Path, layers: int, tiny: bool) -> None:
    """Qwen3_5ForCausalLM with transformers' own initialisation (seed 0), saved in float16."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder(None))
    kinds = ["linear_attention"] * (PERIOD - 1) + ["full_attention"]
    config = transformers.Qwen3_5TextConfig(
        num_hidden_layers=layers, layer_types=kinds * (layers // PERIOD),
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, **(TINY if tiny else {}))
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(config).to(torch.float16)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def write_mtp_block(path: Path) -> None:
    """Random mtp.* tensors as transformers initialises a layer (matrices N(0, 0.02), the
    (1 + w) norms' w at 0), in a weight file of their own that the converter reads beside the
    model's (model-*.safetensors); config.json says mtp_num_hidden_layers 1."""
    config = transformers.AutoConfig.from_pretrained(path)
    generator = torch.Generator().manual_seed(1)
    block = {name: (torch.randn(shape, generator=generator) * config.initializer_range
                    if len(shape) > 1 else torch.zeros(shape)).to(torch.float16)
             for name, shape in optional_weight_shapes(config).items()}
    save_file(block, path / "model-mtp.safetensors", metadata={"format": "pt"})
    settings = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(settings | {"mtp_num_hidden_layers": 1}))


if __name__ == "__main__":
    main()
