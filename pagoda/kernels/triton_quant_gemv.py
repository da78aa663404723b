"""The decode half of pagoda/kernels/triton_quant.py: split-K weight-only GEMVs for a few activation rows.

A decode step's linear reads every weight byte once and does little else, so the whole job is to
keep HBM busy. The grid is (output tiles, K splits): a 4096-wide layer in tiles of 16 columns gives
256 tiles, and splitting K in 4 makes 1,024 programs, enough for every SM of an H200 to hold
several. Each program walks its K range in tiles of [BLOCK_N columns, BLOCK_W 32-bit words]: a
column's words are contiguous in the engine's layout (packed [N, K // 2] for int4, q [N, K] for
int8, read as int32), so a thread's share is one 16-byte load per column.

Unpacking is the other cost: an int-to-float conversion issues at a quarter of the FMA rate, and an
int4 GEMV converts two values per byte it reads. So a value is made from its bits instead: OR-ing
q (0..255) into the mantissa of 2^23 gives the float 2^23 + q, and subtracting 2^23 leaves q
exactly; one shift, one LOP3 and one FADD, all full rate.

int4 sums q * x over each group of a tile, then applies the group's scale and min:
sum_k x_k (q_k s + m) = s * sum_k q_k x_k + m * sum_k x_k. The accumulator keeps one lane per
group and is reduced across threads once, after the loop. int8 applies the row's scale once, at
the end.

Splits are combined without atomics on the values, in a fixed order: each program stores its
partial sums, counts itself in on its column tile's counter, and the last of a tile's programs to
arrive adds the partials (split 0 first), adds the bias, writes the output and resets the counter
for the next launch. One launch, and bit-for-bit the same result whichever program finishes last.
The counters live in a zeroed buffer per device that every launch leaves zeroed again: two GEMVs
on one device must not run concurrently on different streams (the engine uses one).

Tile sizes and split counts are autotuned per (N, K, rows) on a GPU; the interpreter and the kernel
tests use `heuristic_config`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

# Split partials are held for at most this many splits per launch.
MAX_SPLIT_K = 8
_SMALLEST_BLOCK_N = 8
# One counter per column tile: enough for N up to 8 * 65,536 outputs (the widest vocabulary is
# 256K); wider layers take the GEMM.
_COUNTERS = 1 << 16
MAX_GEMV_N = _SMALLEST_BLOCK_N * _COUNTERS
# A config whose tile of per-word sums (BLOCK_M x BLOCK_N x BLOCK_W fp32) gives a thread more
# than this many values is not timed: at 4 rows the widest tiles would spill.
_MAX_ACC_PER_THREAD = 16


@dataclass(frozen=True, slots=True)
class GemvConfig:
    block_n: int  # output columns per program
    block_w: int  # 32-bit words of each column per loop iteration (8 int4 or 4 int8 inputs each)
    split_k: int  # programs that share one column tile's K range
    num_warps: int = 4
    num_stages: int = 2

    def meta(self) -> dict:
        return {"BLOCK_N": self.block_n, "BLOCK_W": self.block_w, "SPLIT_K": self.split_k,
                "num_warps": self.num_warps, "num_stages": self.num_stages}

    def triton_config(self) -> triton.Config:
        return triton.Config({"BLOCK_N": self.block_n, "BLOCK_W": self.block_w,
                              "SPLIT_K": self.split_k}, num_warps=self.num_warps,
                             num_stages=self.num_stages)

    def acc_per_thread(self, block_m: int) -> int:
        """fp32 per-word sums a thread holds for block_m activation rows."""
        return block_m * self.block_n * self.block_w // (32 * self.num_warps)


# Reasoned, not yet measured (no GPU has been lent since they were written). Triton lays a
# [BLOCK_N, BLOCK_W] tile out as 4 words a thread (one 16-byte load) and BLOCK_W / 4 threads along
# K, so a thread covers BLOCK_N * BLOCK_W / (128 * num_warps / 4) / 4 columns: its x values (eight
# scalar loads a word, from L1) serve that many columns. Wide tiles (4 columns a thread) for one
# row, narrow ones where 4 rows multiply the sums; splits so that 4096 outputs give 256-2048
# programs. int4 tiles stay 32 words wide: at 64 the per-group sums of x crossed shared memory
# every iteration (seen in the sm_90 PTX). num_stages stays at 2: the loop has no dot, and
# Triton does not pipeline its loads into shared memory.
INT4_GEMV_CONFIGS = (
    GemvConfig(16, 32, 4),
    GemvConfig(16, 32, 8),
    GemvConfig(32, 32, 8),
    GemvConfig(64, 32, 2),
    GemvConfig(64, 32, 4),
    GemvConfig(64, 32, 8),
    GemvConfig(128, 32, 2, num_warps=8),
    GemvConfig(128, 32, 4, num_warps=8),
)
# An int8 word holds half the inputs of an int4 one: the same shapes, twice the words.
INT8_GEMV_CONFIGS = (
    GemvConfig(8, 64, 4),
    GemvConfig(32, 64, 4),
    GemvConfig(32, 64, 8),
    GemvConfig(32, 64, 2),
    GemvConfig(64, 64, 4, num_warps=8),
)


@triton.jit
def store_rows(out_ptr, acc, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS: tl.constexpr):
    """acc [rows, cols] (+ bias) -> out, in out's dtype."""
    col_ok = cols < N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & col_ok[None, :])


@triton.jit
def nibble_to_float(q):
    """int32 q in 0..15 (nothing above) -> the same value in fp32, through 2^23 + q."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _int8_byte_to_float(byte):
    """A two's-complement byte in the low 8 bits of an int32 (nothing above) -> fp32. XOR with
    128 makes it q + 128 in 0..255, which goes through 2^23 as a nibble does."""
    return ((byte ^ 128) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def _load_x(x_ptr, M, stride_xm, offsets, mask, BLOCK_M: tl.constexpr):
    """x[rows, offsets] in fp32, [BLOCK_M, 1, words]: one row at a time. A load of fewer values
    than the program has threads is repeated in the layout its users need; a larger one would be
    shuffled through shared memory. Rows past M reread the last row (never stored)."""
    rows = tl.arange(0, BLOCK_M)[:, None, None]
    x = tl.zeros((BLOCK_M, 1, offsets.shape[2]), dtype=tl.float32)
    for r in tl.static_range(BLOCK_M):
        row = tl.load(x_ptr + tl.minimum(r, M - 1) * stride_xm + offsets, mask=mask, other=0.0)
        x = tl.where(rows == r, row.to(tl.float32), x)
    return x


@triton.jit
def _split_words(k_words, BLOCK_W: tl.constexpr, SPLIT_K: tl.constexpr):
    """This program's word range [start, end) of every column: whole BLOCK_W tiles, so that
    no tile straddles two splits. Splits past the last tile get an empty range."""
    tiles_per_split = tl.cdiv(tl.cdiv(k_words, BLOCK_W), SPLIT_K)
    start = tl.program_id(1) * tiles_per_split * BLOCK_W
    return start, tl.minimum(start + tiles_per_split * BLOCK_W, k_words)


@triton.jit
def _store_or_combine(out_ptr, partial_ptr, counter_ptr, total, bias_ptr, rows, cols, M, N,
                      stride_om, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    """total [BLOCK_M, BLOCK_N]: this program's sums. With one split they are the output; with
    more, the last program of the column tile to finish adds all the splits' sums in order."""
    if SPLIT_K == 1:
        store_rows(out_ptr, total, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS)
    else:
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        partials = partial_ptr + rows[:, None] * N + cols[None, :]
        tl.store(partials + tl.program_id(1) * M * N, total, mask=mask)
        # Every thread's stores come before the count that publishes them (release), and the
        # last program reads the others' from L2 only after seeing the count (acquire).
        tl.debug_barrier()
        counter = counter_ptr + tl.program_id(0)
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            summed = tl.zeros_like(total)
            for split in tl.static_range(SPLIT_K):
                summed += tl.load(partials + split * M * N, mask=mask, other=0.0,
                                  cache_modifier=".cg")
            store_rows(out_ptr, summed, bias_ptr, rows, cols, M, N, stride_om, HAS_BIAS)
            tl.atomic_xchg(counter, 0)


@triton.jit
def _per_group(t, GROUPS: tl.constexpr):
    """[a, b, words] -> [a, b, GROUPS]: the sum over each group's words (consecutive, in-thread
    up to four words)."""
    return tl.sum(tl.reshape(t, (t.shape[0], t.shape[1], GROUPS, t.shape[2] // GROUPS)), axis=3)


# The group strides (1 in the engine's layouts) are not specialized: loading a tile's scales and
# mins as vectors would give them a layout of their own, and the per-group sums would cross shared
# memory every iteration to meet it; scalar loads take the sums' layout.
@triton.jit(do_not_specialize=["stride_sg", "stride_mg"])
def _int4_gemv_kernel(out_ptr, partial_ptr, counter_ptr, x_ptr, words_ptr, scales_ptr, mins_ptr,
                      bias_ptr, M, N, K_WORDS, stride_xm, stride_xk, stride_wn, stride_sn,
                      stride_sg, stride_mn, stride_mg, stride_om, WORDS_PER_GROUP: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                      SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    GROUPS: tl.constexpr = BLOCK_W // WORDS_PER_GROUP  # tiles are whole groups
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    col3 = cols.to(tl.int64)[None, :, None]
    start, end = _split_words(K_WORDS, BLOCK_W, SPLIT_K)
    # [rows, columns, groups]: reduced across threads once, after the loop.
    acc = tl.zeros((BLOCK_M, BLOCK_N, GROUPS), dtype=tl.float32)
    for w0 in range(start, end, BLOCK_W):
        words = w0 + tl.arange(0, BLOCK_W)[None, None, :]
        word_ok = words < end
        w = tl.load(words_ptr + col3 * stride_wn + words, mask=col_ok[None, :, None] & word_ok,
                    other=0)
        qx = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_W), dtype=tl.float32)
        x_sum = tl.zeros((BLOCK_M, 1, BLOCK_W), dtype=tl.float32)
        for j in tl.static_range(8):
            # Nibble j of word w is input 8w + j: bytes in little-endian order, low nibble first.
            x = _load_x(x_ptr, M, stride_xm, (words * 8 + j) * stride_xk, word_ok, BLOCK_M)
            qx += nibble_to_float((w >> (4 * j)) & 15) * x
            x_sum += x
        groups = w0 // WORDS_PER_GROUP + tl.arange(0, GROUPS)[None, None, :]
        mask = col_ok[None, :, None] & (groups * WORDS_PER_GROUP < end)
        s = tl.load(scales_ptr + col3 * stride_sn + groups * stride_sg, mask=mask,
                    other=0.0).to(tl.float32)
        m = tl.load(mins_ptr + col3 * stride_mn + groups * stride_mg, mask=mask,
                    other=0.0).to(tl.float32)
        acc += _per_group(qx, GROUPS) * s + _per_group(x_sum, GROUPS) * m
    _store_or_combine(out_ptr, partial_ptr, counter_ptr, tl.sum(acc, axis=2), bias_ptr, rows,
                      cols, M, N, stride_om, SPLIT_K, HAS_BIAS)


@triton.jit
def _int8_gemv_kernel(out_ptr, partial_ptr, counter_ptr, x_ptr, words_ptr, scales_ptr, bias_ptr,
                      M, N, K_WORDS, stride_xm, stride_xk, stride_wn, stride_s, stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                      SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_cols = words_ptr + cols.to(tl.int64)[None, :, None] * stride_wn
    start, end = _split_words(K_WORDS, BLOCK_W, SPLIT_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_W), dtype=tl.float32)
    for w0 in range(start, end, BLOCK_W):
        words = w0 + tl.arange(0, BLOCK_W)[None, None, :]
        word_ok = words < end
        w = tl.load(w_cols + words, mask=col_ok[None, :, None] & word_ok, other=0)
        for j in tl.static_range(4):
            x = _load_x(x_ptr, M, stride_xm, (words * 4 + j) * stride_xk, word_ok, BLOCK_M)
            acc += _int8_byte_to_float((w >> (8 * j)) & 255) * x
    # One scale per output feature: applied once, after the sum.
    scale = tl.load(scales_ptr + cols * stride_s, mask=col_ok, other=0.0).to(tl.float32)
    _store_or_combine(out_ptr, partial_ptr, counter_ptr, tl.sum(acc, axis=2) * scale[None, :],
                      bias_ptr, rows, cols, M, N, stride_om, SPLIT_K, HAS_BIAS)


def as_words(t: torch.Tensor) -> torch.Tensor | None:
    """A byte tensor [N, bytes] (uint8 or int8, rows contiguous) as int32 words [N, bytes // 4],
    or None where its rows are not whole, 4-byte aligned words."""
    if t.shape[1] % 4 or t.stride(0) % 4 or t.storage_offset() % 4 or t.stride(1) != 1:
        return None
    return t.view(torch.int32)


def int4_gemv(out: torch.Tensor, x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor,
              mins: torch.Tensor, group_size: int, bias: torch.Tensor | None,
              config: GemvConfig | None = None) -> None:
    """out [M, N] = x [M, K] times the int4 weight (packed bytes as `as_words`, group_size a
    multiple of 8); autotuned unless a config is given (or under the interpreter)."""
    m, n = out.shape
    assert group_size % 8 == 0 and n <= MAX_GEMV_N
    args = (out, _partials(out), _split_counters(out.device), x, words, scales, mins,
            bias_or(bias, out), m, n, words.shape[1], x.stride(0), x.stride(1), words.stride(0),
            *scales.stride(), *mins.stride(), out.stride(0))
    meta = {"WORDS_PER_GROUP": group_size // 8, "BLOCK_M": triton.next_power_of_2(m),
            "HAS_BIAS": bias is not None}
    _launch(_int4_gemv_kernel, INT4_GEMV_TUNED, args, meta, n, words.shape[1], config)


def int8_gemv(out: torch.Tensor, x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor,
              bias: torch.Tensor | None, config: GemvConfig | None = None) -> None:
    """out [M, N] = x [M, K] times the int8 weight (q as `as_words`, one scale per row)."""
    m, n = out.shape
    assert n <= MAX_GEMV_N
    args = (out, _partials(out), _split_counters(out.device), x, words, scales,
            bias_or(bias, out), m, n, words.shape[1], x.stride(0), x.stride(1), words.stride(0),
            scales.stride(0), out.stride(0))
    meta = {"BLOCK_M": triton.next_power_of_2(m), "HAS_BIAS": bias is not None}
    _launch(_int8_gemv_kernel, INT8_GEMV_TUNED, args, meta, n, words.shape[1], config)


def bias_or(bias: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """The bias, or any tensor to stand in for the pointer the kernel will not read."""
    if bias is None:
        return placeholder
    assert bias.stride(0) == 1
    return bias


def configs_for(configs: tuple[GemvConfig, ...], block_m: int, k_words: int,
                words_per_group: int = 1) -> list[GemvConfig]:
    """The configs worth timing for BLOCK_M rows, K_WORDS words a column and (int4) groups of
    words_per_group words: tiles widened to whole groups, accumulators that fit in registers,
    and no more splits than the K range has tiles (else the smallest)."""
    widened = list(dict.fromkeys(_whole_groups(c, words_per_group) for c in configs))
    kept = [c for c in widened if c.acc_per_thread(block_m) <= _MAX_ACC_PER_THREAD
            and c.split_k <= triton.cdiv(k_words, c.block_w)]
    return kept or [min(widened, key=lambda c: (c.acc_per_thread(block_m), c.split_k))]


def _whole_groups(config: GemvConfig, words_per_group: int) -> GemvConfig:
    return replace(config, block_w=max(config.block_w, words_per_group))


def heuristic_config(n: int, k_words: int, device: torch.device,
                     words_per_group: int = 1) -> GemvConfig:
    """The one config used where nothing is timed. On a GPU (kernel tests): 16 columns and 32
    words a program, and the fewest splits (up to 8) that give every SM four programs. Under the
    interpreter, which runs programs one after another in Python: the fewest, widest programs."""
    if device.type != "cuda":
        return GemvConfig(64, max(words_per_group, min(128, triton.next_power_of_2(k_words))), 1)
    block_w = max(words_per_group, 32)
    tiles = triton.cdiv(k_words, block_w)
    split = 1
    while split < min(MAX_SPLIT_K, tiles) and triton.cdiv(n, 16) * split < 4 * sm_count(device):
        split *= 2
    return GemvConfig(16, block_w, split)


@functools.cache
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def autotuned(kernel, configs: list[triton.Config], key: list[str], prune):
    """kernel autotuned over configs (times cached on disk), or None under the interpreter,
    which would run every config in Python."""
    if triton.knobs.runtime.interpret:
        return None
    # Short timing runs: a new layer shape costs well under a second per config at start-up.
    bench = functools.partial(do_bench, warmup=5, rep=20)
    return triton.autotune(configs, key=key, prune_configs_by={"early_config_prune": prune},
                           do_bench=bench, cache_results=True)(kernel)


def _prune(gemv_configs: tuple[GemvConfig, ...]):
    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        kept = configs_for(gemv_configs, kwargs["BLOCK_M"], named_args["K_WORDS"],
                           kwargs.get("WORDS_PER_GROUP", 1))
        return [c.triton_config() for c in kept]

    return prune


INT4_GEMV_TUNED = autotuned(_int4_gemv_kernel, [c.triton_config() for c in INT4_GEMV_CONFIGS],
                            ["N", "K_WORDS", "BLOCK_M"], _prune(INT4_GEMV_CONFIGS))
INT8_GEMV_TUNED = autotuned(_int8_gemv_kernel, [c.triton_config() for c in INT8_GEMV_CONFIGS],
                            ["N", "K_WORDS", "BLOCK_M"], _prune(INT8_GEMV_CONFIGS))
# Off: every launch takes `heuristic_config` (kernel tests on a GPU, where timing each test's
# shapes would cost more than the tests).
AUTOTUNE = True


def _launch(kernel, tuned, args: tuple, meta: dict, n: int, k_words: int,
            config: GemvConfig | None) -> None:
    def grid(launch_meta: dict) -> tuple[int, int]:
        return triton.cdiv(n, launch_meta["BLOCK_N"]), launch_meta["SPLIT_K"]

    if config is None and tuned is not None and AUTOTUNE:
        tuned[grid](*args, **meta)
        return
    words_per_group = meta.get("WORDS_PER_GROUP", 1)
    config = _whole_groups(config, words_per_group) if config else heuristic_config(
        n, k_words, args[0].device, words_per_group)
    assert config.split_k <= MAX_SPLIT_K and config.block_n >= _SMALLEST_BLOCK_N
    kernel[grid](*args, **meta, **config.meta())


def _partials(out: torch.Tensor) -> torch.Tensor:
    return torch.empty((MAX_SPLIT_K, *out.shape), dtype=torch.float32, device=out.device)


@functools.cache
def _split_counters(device: torch.device) -> torch.Tensor:
    """Zeroed once; every launch leaves it zeroed. Kept for the process's life, so a CUDA graph
    that captured its address stays valid."""
    return torch.zeros(_COUNTERS, dtype=torch.int32, device=device)
