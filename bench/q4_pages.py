"""q4_gemv's one-row pass on Q4_K records in huge pages and in 4 KB pages, from memory, beside a
plain read of the same bytes.

Not a test: `python bench/q4_pages.py` repacks random Q4_K parts at the Qwen3-30B-A3B attention
linears' shapes (fused qkv 5120 x 2048, o 2048 x 4096) into `--copies` copies each (20: 218 MB,
far past a 32 MB L3), once into `pagoda.kernels.cpu.huge_pages.huge_page_buffer`s (as the engine's
records now are) and once into `torch.empty` ones (4 KB pages). Each round calls `q4_linear16`
at one row on every copy in a decode step's order (qkv, o, qkv, o, ...), then reads the same
records plainly (a C loop of AVX2 loads on the same OpenMP team, built here), for both kinds of
pages, rounds interleaving them so another process's burst lands on both alike. Every call's
time is kept; the table gives the `--percentile`th (20: a shared machine's quiet calls) in µs
and GB/s of records read. Compare only within one run.
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
import time
from pathlib import Path

import torch
from cpu_info import cpu_name

from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.huge_pages import huge_page_buffer
from pagoda.kernels.cpu.q4_gemv import KQ_RECORDS, KQ_SUPER_BLOCK, Q4Gemv

SHAPES = (("qkv", 5120, 2048), ("o", 2048, 4096))
PLAIN_READ = r"""
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* Every byte of p[0, n) loaded once (n a multiple of 128), split over the team. */
__attribute__((target("avx2")))
int plain_read(const uint8_t *p, size_t n, int threads)
{
    int sink = 0;
    long lines = (long)(n / 128);
#pragma omp parallel num_threads(threads) reduction(^ : sink)
    {
        __m256i a = _mm256_setzero_si256();
#pragma omp for schedule(static)
        for (long i = 0; i < lines; i++) {
            const __m256i *v = (const __m256i *)(p + 128 * i);
            a = _mm256_xor_si256(a, _mm256_loadu_si256(v));
            a = _mm256_xor_si256(a, _mm256_loadu_si256(v + 1));
            a = _mm256_xor_si256(a, _mm256_loadu_si256(v + 2));
            a = _mm256_xor_si256(a, _mm256_loadu_si256(v + 3));
        }
        sink ^= _mm256_extract_epi32(a, 0);
    }
    return sink;
}
"""


def plain_reader(out: Path) -> ctypes.CDLL:
    """PLAIN_READ built as our kernels are (on torch's OpenMP runtime)."""
    source = out / "src"
    source.mkdir()
    (source / "plain_read.c").write_text(PLAIN_READ)
    lib = native._open(native.build("plain_read", out / "build", source_dir=source))
    lib.plain_read.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lib


def records(q4: Q4Gemv, n: int, k: int, buffer) -> torch.Tensor:
    """Random Q4_K parts for [n, k] repacked into buffer(size)."""
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    d = (torch.rand(n, k // KQ_SUPER_BLOCK) * 1e-3).half()
    sc, m = (torch.randint(0, 64, (n, k // 32), dtype=torch.uint8) for _ in range(2))
    out = buffer(q4.repacked_bytes(n, k, KQ_RECORDS))
    rc = q4.raw.q4_repack_kq(packed.data_ptr(), d.data_ptr(), d.data_ptr(), sc.data_ptr(),
                             m.data_ptr(), n, k, out.data_ptr())
    if rc:
        raise RuntimeError("q4_repack_kq refused the parts")
    return out


def percentile(times: list[float], p: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--percentile", type=float, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = Path(tempfile.mkdtemp(prefix="q4_pages_"))
    q4 = Q4Gemv.load(out / "q4")
    reader = plain_reader(out)
    pages = {"huge pages": huge_page_buffer,
             "4 KB pages": lambda size: torch.empty(size, dtype=torch.uint8)}
    weights = {kind: {name: [records(q4, n, k, buffer) for _ in range(args.copies)]
                      for name, n, k in SHAPES} for kind, buffer in pages.items()}
    fn = q4.raw.q4_linear16
    calls = {}
    for name, n, k in SHAPES:
        x, y = torch.randn(1, k), torch.empty(1, n)
        work = torch.empty(q4.workspace16_bytes(1, k), dtype=torch.uint8)
        calls[name] = (n, k, x, y, work)
    times = {(kind, what): [] for kind in pages for what in (*calls, "plain read")}
    for _ in range(args.rounds):
        for kind in pages:
            for i in range(args.copies):
                for name, (n, k, x, y, work) in calls.items():
                    w = weights[kind][name][i]
                    start = time.perf_counter()
                    rc = fn(-1, w.data_ptr(), KQ_RECORDS, n, k, x.data_ptr(), 1, y.data_ptr(),
                            work.data_ptr(), args.threads)
                    times[kind, name].append(time.perf_counter() - start)
                    if rc:
                        raise RuntimeError("q4_linear16 refused its arguments")
            for i in range(args.copies):
                w = weights[kind]["qkv"][i]
                start = time.perf_counter()
                reader.plain_read(w.data_ptr(), w.numel() // 128 * 128, args.threads)
                times[kind, "plain read"].append(time.perf_counter() - start)
    print(f"CPU: {cpu_name()}, {args.threads} threads, {args.copies} copies a shape, "
          f"{args.rounds} rounds; µs a call (GB/s of records), {args.percentile:g}th percentile")
    print("\n| records | " + " | ".join(f"{name} {n} x {k}" for name, n, k in SHAPES)
          + " | plain read of qkv's |")
    print("|---|" + "---|" * (len(SHAPES) + 1))
    for kind in pages:
        cells = []
        for what in (*calls, "plain read"):
            seconds = percentile(times[kind, what], args.percentile)
            size = weights[kind]["qkv" if what == "plain read" else what][0].numel()
            cells.append(f"{seconds * 1e6:.1f} ({size / seconds / 1e9:.1f})")
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
