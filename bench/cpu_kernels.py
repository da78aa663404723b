"""CPU matmul kernels for quantized layers, timed side by side on the default model's shapes.

Not a test: `python bench/cpu_kernels.py` prints one table (median µs per call, each kernel
cycling through 30 copies of a layer's weights, as one decode step reads 30 layers, so the
weights come from memory rather than from a warm cache), and each kernel's relative error at
64 rows against the float weights it was quantized from, on activations with a few large
channels (int4's error there is its weights' own rounding). Kernels that this torch (or torchao,
when installed) lacks, or that refuse to run on this CPU, are reported as such.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from cpu_info import cpu_name

from pagoda.engine.quantization.cpu_int4 import CpuInt4Method
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy
from pagoda.engine.quantization.tensors import quantize_int4, quantize_int8

# (name, outputs, inputs): SmolLM2-135M's fused projections.
SHAPES = (("qkv", 960, 576), ("gate_up", 3072, 576), ("down", 576, 1536))
LAYERS = 30


def _timed(fn: Callable[[int], object], repeats: int, budget_s: float = 0.15) -> float:
    """Median over repeats of the mean µs per call, fn(i) taking layer i % LAYERS; as many
    calls per repeat as fit the budget (a scalar kernel gets few)."""
    start = time.perf_counter()
    for i in range(LAYERS):
        fn(i)
        if time.perf_counter() - start > budget_s:
            break
    once = (time.perf_counter() - start) / (i + 1)
    calls = max(1, min(3000, int(budget_s / once)))
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(calls):
            fn(i % LAYERS)
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


def _activations(m: int, k: int) -> torch.Tensor:
    """Normal rows with a few channels 20x larger, as a transformer's hidden states have."""
    x = torch.randn(m, k)
    x[:, :4] *= 20
    return x


def _relative_error(make: Callable[[torch.Tensor], Callable[[int], object]],
                    float_w: torch.Tensor, k: int) -> float:
    """Against the product with the float weights the layer was quantized from."""
    x = _activations(64, k)
    want = F.linear(x, float_w)
    got = make(x)(0).float()
    return ((got - want).norm() / want.norm()).item()


def _row_quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
    return torch.round(x / scale).to(torch.int8), scale


def _candidates(float_w: list[torch.Tensor]) -> dict:
    """Each builds its 30 layers' weights once and returns, per input, a call on layer i."""
    int4 = [CpuInt4Method(quantize_int4(w), CpuPathPolicy()) for w in float_w]
    int8 = [quantize_int8(w) for w in float_w]
    q8_t = [w.q.t().contiguous() for w in int8]
    scales_bf16 = [w.scales.bfloat16() for w in int8]
    bf16_w = [w.bfloat16() for w in float_w]
    out: dict[str, Callable[[torch.Tensor], Callable[[int], object]]] = {
        "int4pack bf16 in/out": lambda x: partial(lambda xb, i: int4[i]._multiply(xb), x.bfloat16()),
        "int4pack fp32 in/out (today)": lambda x: (lambda i: int4[i].kernel(x)),
        "int8pack (per channel) bf16": lambda x: partial(
            lambda xb, i: torch.ops.aten._weight_int8pack_mm(xb, int8[i].q, scales_bf16[i]),
            x.bfloat16()),
        "F.linear fp32": lambda x: (lambda i: F.linear(x, float_w[i])),
        "F.linear bf16": lambda x: partial(lambda xb, i: F.linear(xb, bf16_w[i]), x.bfloat16()),
        "_int_mm int8 (row-quantized x)": lambda x: (
            lambda i: _int_mm_linear(x, q8_t[i], int8[i].scales)),
    }
    out.update(_fbgemm_candidates(float_w))
    out.update(_torchao_candidates(int4, float_w))
    return out


def _int_mm_linear(x: torch.Tensor, q_t: torch.Tensor, w_scales: torch.Tensor) -> torch.Tensor:
    xq, x_scale = _row_quantized(x)
    return torch._int_mm(xq, q_t).float() * x_scale * w_scales


def _fbgemm_candidates(float_w: list[torch.Tensor]) -> dict:
    """torch's dynamic int8 linear (per-tensor uint8 activations, per-channel int8 weights)."""
    try:
        torch.backends.quantized.engine = "x86"
        packed = []
        for w in float_w:
            scales = w.abs().amax(dim=1).clamp_min(1e-12) / 127
            zeros = torch.zeros(len(w), dtype=torch.long)
            with warnings.catch_warnings():  # torch.ao's deprecation notice, once per layer
                warnings.simplefilter("ignore")
                qw = torch.quantize_per_channel(w, scales.double(), zeros, 0, torch.qint8)
            packed.append(torch.ops.quantized.linear_prepack(qw, None))
    except (RuntimeError, AttributeError) as error:
        return {"quantized.linear_dynamic (x86)": f"absent: {error}".splitlines()[0]}
    return {"quantized.linear_dynamic (x86)": lambda x: (
        lambda i: torch.ops.quantized.linear_dynamic(x, packed[i], False))}


def _torchao_candidates(int4: list[CpuInt4Method], float_w: list[torch.Tensor]) -> dict:
    try:
        import torchao  # noqa: F401  (registers torch.ops.torchao)
        prepack = torch.ops.torchao.da8w4_linear_prepack_cpu
    except (ImportError, AttributeError, RuntimeError) as error:
        return {"torchao da8w4_linear_cpu": f"absent: {error}".splitlines()[0]}
    try:
        n, k = float_w[0].shape
        q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
        prepack(q, torch.rand(n, k // 32), torch.zeros(n, k // 32, dtype=torch.int8))
    except (RuntimeError, NotImplementedError) as error:
        return {"torchao da8w4_linear_cpu": "no CPU kernel in this build: "
                + str(error).splitlines()[0][:90]}
    return {"torchao da8w4_linear_cpu": "prepacks, but timing it is not written yet"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"capability {torch.backends.cpu.get_cpu_capability()}; median µs per call")
    for name, n, k in SHAPES:
        print(f"\n{name} {k}->{n}: " + " | ".join(f"{m:>8} rows" for m in args.rows)
              + " | rel. error")
        float_w = [torch.randn(n, k) * 0.05 for _ in range(LAYERS)]
        for kernel, make in _candidates(float_w).items():
            if isinstance(make, str):
                print(f"  {kernel:32s} {make}")
                continue
            cells = []
            for m in args.rows:
                x = _activations(m, k)
                try:
                    cells.append(f"{_timed(make(x), args.repeats):13.1f}")
                except RuntimeError as error:
                    cells.append(f"{'fails':>13}")
                    print(f"    ({kernel}, {m} rows: {str(error).splitlines()[0][:100]})")
            error = _relative_error(make, float_w[0], k)
            print(f"  {kernel:32s}" + " |".join(cells) + f" | {error:10.4f}", flush=True)


if __name__ == "__main__":
    main()
