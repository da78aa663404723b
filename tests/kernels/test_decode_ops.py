"""pagoda/kernels/cpu/decode_ops.c gives what torch_ref gives, op by op, on the default model's shapes
and odd ones, with both its scalar and AVX2 bodies; decode attention reads the paged cache in
place (partial blocks, several sequences, GQA 1 and 3, sliding windows, narrow caches)."""

import itertools

import pytest
import torch

from pagoda.kernels import torch_ref
from pagoda.kernels.attention_metadata import AttentionMetadata, DecodeGroup, PrefillSegment
from pagoda.kernels.cpu import decode_ops
from pagoda.kernels.cpu.decode_ops import AVX2, AVX512, BEST_ISA, SCALAR, DecodeOps
from pagoda.kernels.cpu.native import find_compiler
from pagoda.kernels.kernel_ops import TORCH_OPS
from pagoda.kernels.ops import select_ops

ISAS = pytest.mark.parametrize("isa", [SCALAR, AVX2, AVX512], ids=["scalar", "avx2", "avx512"])
# The default model: hidden 576, 9 heads over 3 kv heads of 64, intermediate 1536.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 576, 9, 3, 64, 1536
EPS = 1e-5


@pytest.fixture(scope="module")
def lib(kernel_build_dir) -> DecodeOps:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/decode_ops.c")
    return DecodeOps.load(kernel_build_dir)


@pytest.fixture
def ops(lib, isa) -> DecodeOps:
    if not lib.isa_supported(isa):
        pytest.skip(f"this CPU cannot run instruction set {isa} (so that path is untested here)")
    lib.set_isa(isa)
    yield lib
    lib.set_isa(BEST_ISA)


@ISAS
@pytest.mark.parametrize("shape", [(1, HIDDEN), (5, HIDDEN), (3, 64), (2, 100)])
def test_rms_norm_matches_torch(ops, shape):
    torch.manual_seed(0)
    x, w = torch.randn(*shape) * 3, torch.randn(shape[1])
    torch.testing.assert_close(ops.rms_norm(x, w, EPS), torch_ref.rms_norm(x, w, EPS))


@ISAS
def test_rms_norm_reads_rows_of_a_wider_tensor(ops):
    wide = torch.randn(4, HIDDEN + 64)
    x, w = wide[:, :HIDDEN], torch.randn(HIDDEN)
    torch.testing.assert_close(ops.rms_norm(x, w, EPS), torch_ref.rms_norm(x, w, EPS))


@ISAS
@pytest.mark.parametrize("shape", [(1, HIDDEN), (3, HIDDEN), (2, 100)])
def test_add_rms_norm_adds_in_place_and_normalises_the_sum(ops, shape):
    torch.manual_seed(1)
    x, residual, w = torch.randn(*shape), torch.randn(*shape), torch.randn(shape[1])
    want_normed, want_sum = torch_ref.add_rms_norm(x.clone(), residual, w, EPS)
    normed, new_residual = ops.add_rms_norm(x, residual, w, EPS)
    assert new_residual is x
    torch.testing.assert_close(x, want_sum, rtol=0, atol=0)
    torch.testing.assert_close(normed, want_normed)


def _rope_tables(n: int, hd: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(n, 1, hd // 2) * 50
    cos = torch.cat((angles.cos(), angles.cos()), -1)
    sin = torch.cat((-angles.sin(), angles.sin()), -1)
    return cos, sin


@ISAS
@pytest.mark.parametrize("n,hd", [(1, HEAD_DIM), (4, HEAD_DIM), (3, 12)])
def test_rotary_matches_torch_on_the_q_and_k_of_a_fused_projection(ops, n, hd):
    torch.manual_seed(2)
    qkv = torch.randn(n, (HEADS + 2 * KV_HEADS) * hd)
    q_and_k = qkv[:, :(HEADS + KV_HEADS) * hd].view(n, -1, hd)  # rows strided, as in the model
    cos, sin = _rope_tables(n, hd)
    torch.testing.assert_close(ops.rotary_embedding(q_and_k, cos, sin),
                               torch_ref.rotary_embedding(q_and_k, cos, sin))


@ISAS
@pytest.mark.parametrize("shape", [(1, 2 * INTERMEDIATE), (3, 2 * INTERMEDIATE), (2, 26)])
def test_silu_and_mul_matches_torch(ops, shape):
    torch.manual_seed(3)
    x = torch.randn(*shape) * 4
    x[0, :3] = torch.tensor([-100.0, 90.0, 0.0])  # exp under- and overflow
    torch.testing.assert_close(ops.silu_and_mul(x), torch_ref.silu_and_mul(x))


@ISAS
@pytest.mark.parametrize("width", [4096, 26])
def test_sigmoid_mul_matches_torch_on_a_strided_gate(ops, width):
    """A gated attention's output times sigmoid of the gate, which sits in qkv's rows."""
    torch.manual_seed(3)
    qkv = torch.randn(3, 2 * width + 8) * 4
    qkv[0, -3:] = torch.tensor([-100.0, 90.0, 0.0])  # exp under- and overflow
    x, gate = torch.randn(3, width), qkv[:, -width:]
    torch.testing.assert_close(ops.sigmoid_mul(x, gate), torch_ref.sigmoid_mul(x, gate))


@ISAS
@pytest.mark.parametrize("shape", [(2, 2 * INTERMEDIATE), (3, 2 * INTERMEDIATE), (2, 26)])
def test_gelu_tanh_and_mul_matches_torch_to_its_own_precision(ops, shape):
    """Gemma's GeGLU. Not torch's bits: its tanh is Sleef's, ours x / (1 + e^-2u) from exp
    (the eager CPU path runs ours too: test_cpu_ops_come_from_the_library_when_it_loads).
    Ours is within 2e-5 of the exact value everywhere; torch's 1 + tanh(u) cancels where
    the gate is very negative, so the two agree to an ulp of the gate, not of the result."""
    torch.manual_seed(3)
    x = torch.randn(*shape) * 4
    x[0, :4] = torch.tensor([-100.0, 90.0, 0.0, -1e20])  # exp under- and overflow, x^3 to -inf
    x[1, :2] = torch.tensor([1e-30, -6.0])  # near zero, and where torch's 1 + tanh is 0
    got = ops.gelu_tanh_and_mul(x)
    gate, up = x.double().chunk(2, dim=-1)
    exact = 0.5 * gate * (1 + torch.tanh(0.7978845608028654 * (gate + 0.044715 * gate ** 3))) * up
    torch.testing.assert_close(got, exact.float(), rtol=2e-5, atol=1e-12)
    torch_error = (got - torch_ref.gelu_tanh_and_mul(x)).abs()
    assert (torch_error <= 1e-6 * (gate.abs() + 1).float() * up.abs().float()).all()


def _as_sets(indices: torch.Tensor) -> list[set[int]]:
    return [set(row.tolist()) for row in indices]


@ISAS
@pytest.mark.parametrize(("rows", "n", "k"), [(1, 49152, 32), (32, 49152, 32), (3, 100, 7),
                                              (2, 37, 37), (4, 1000, 256)])
def test_top_k_indices_are_torch_topks_set(ops, rows, n, k):
    torch.manual_seed(rows + n + k)
    x = torch.randn(rows, n) * 5
    got = ops.top_k_indices(x, k)
    assert got.shape == (rows, k) and got.dtype == torch.int64
    assert _as_sets(got) == _as_sets(torch_ref.top_k_indices(x, k))


@ISAS
def test_top_k_counts_nan_largest_and_keeps_the_first_of_ties_at_the_kth_place(ops):
    x = torch.zeros(2, 64)
    x[0, 40] = float("nan")
    x[0, 50] = 3.0
    x[1, 60] = 9.0
    x[1, 30] = x[1, 20] = x[1, 10] = 1.0  # four places for three: ties at the k-th are zeros
    assert _as_sets(ops.top_k_indices(x, 2)) == [{40, 50}, {60, 10}]
    assert _as_sets(ops.top_k_indices(x, 5)) == [{40, 50, 0, 1, 2}, {60, 10, 20, 30, 0}]


@ISAS
def test_top_k_reads_the_rows_of_a_wider_tensor(ops):
    torch.manual_seed(7)
    wide = torch.randn(3, 300)
    x = wide[:, :200]
    assert _as_sets(ops.top_k_indices(x, 16)) == _as_sets(torch_ref.top_k_indices(x, 16))


@ISAS
@pytest.mark.parametrize(("rows", "n"), [(1, 49152), (17, 1000), (3, 37), (2, 5)])
def test_row_argmax_is_torchs_argmax(ops, rows, n):
    torch.manual_seed(rows * n)
    x = torch.randn(rows, n + 3)[:, :n] * 5  # rows of a wider tensor
    assert torch.equal(ops.row_argmax(x), x.argmax(dim=-1))


@ISAS
def test_row_argmax_takes_the_first_of_equal_largest_and_the_first_nan(ops):
    x = torch.zeros(4, 43)
    x[0, [9, 12, 41]] = 2.0  # ties: the first
    x[1, [3, 30, 42]] = torch.tensor([float("nan"), 5.0, float("nan")])  # NaN largest: first
    x[2] = float("-inf")  # nothing larger than -inf: index 0
    x[3, [1, 40]] = torch.tensor([-0.0, 0.0])  # every value 0 (signed or not): the first
    assert ops.row_argmax(x).tolist() == [9, 3, 0, 0] == x.argmax(dim=-1).tolist()


def test_top_k_beyond_the_kernels_reach_is_torchs(lib):
    x = torch.randn(2, 1000)
    assert torch.equal(lib.top_k_indices(x, 300), torch_ref.top_k_indices(x, 300))
    assert torch.equal(lib.top_k_indices(x.double(), 5), torch_ref.top_k_indices(x.double(), 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kv_write_rounds_like_torch_into_each_cache_dtype(lib, dtype):
    torch.manual_seed(4)
    n = 5
    qkv = torch.randn(n, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    qkv[0, -8:] = torch.tensor([1e-6, -3e-8, 7e4, -1e5, 65519.0, 1 / 3, float("inf"), 0.0])
    k = qkv[:, HEADS * HEAD_DIM:(HEADS + KV_HEADS) * HEAD_DIM].view(n, KV_HEADS, HEAD_DIM)
    v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM:].view(n, KV_HEADS, HEAD_DIM)
    caches = [torch.zeros(8, 16, KV_HEADS, HEAD_DIM, dtype=dtype) for _ in range(4)]
    slots = torch.tensor([3, 17, 16, 127, 64])
    lib.write_kv_cache(k, v, caches[0], caches[1], slots)
    torch_ref.write_kv_cache(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_kv_write_refuses_a_slot_outside_the_cache(lib):
    k = torch.randn(1, KV_HEADS, HEAD_DIM)
    cache = torch.zeros(2, 16, KV_HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="pg_write_kv"):
        lib.write_kv_cache(k, k, cache, cache.clone(), torch.tensor([32]))


def _filled_caches(num_blocks: int, block_size: int, kv_heads: int, hd: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Random keys and values in every slot: whatever is read outside a context shows up."""
    shape = (num_blocks, block_size, kv_heads, hd)
    return torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)


def _decode_metadata(context_lens: list[int], block_size: int, num_blocks: int,
                     window: int = 0, groups: int = 1) -> AttentionMetadata:
    """Sequences (longest first) on shuffled blocks, in `groups` decode groups, as the model
    runner builds them: padded block tables, the mask, the context lengths."""
    perm = torch.randperm(num_blocks).tolist()
    tables = [[perm.pop() for _ in range(-(-n // block_size))] for n in context_lens]
    slots = [t[(n - 1) // block_size] * block_size + (n - 1) % block_size
             for t, n in zip(tables, context_lens, strict=True)]
    bounds = torch.linspace(0, len(context_lens), groups + 1).round().long().tolist()
    decode_groups = []
    for start, end in itertools.pairwise(bounds):
        lens = context_lens[start:end]
        width = -(-max(lens) // block_size)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables[start:end]])
        q_pos = torch.tensor(lens).unsqueeze(1) - 1
        k_pos = torch.arange(width * block_size).unsqueeze(0)
        mask = k_pos <= q_pos
        if window:
            mask &= k_pos > q_pos - window
        decode_groups.append(DecodeGroup(start, end, table, mask.view(end - start, 1, 1, -1),
                                         torch.tensor(lens)))
    return AttentionMetadata(torch.tensor(slots), decode_groups, sliding_window=window)


def _step_qkv(n: int, heads: int, kv_heads: int, hd: int):
    """q, k, v as the model slices them out of one fused projection (strided rows)."""
    qkv = torch.randn(n, (heads + 2 * kv_heads) * hd)
    q_and_k = qkv[:, :(heads + kv_heads) * hd].view(n, -1, hd).clone()
    q, k = q_and_k.split((heads, kv_heads), dim=1)
    v = qkv[:, (heads + kv_heads) * hd:].view(n, kv_heads, hd)
    return q, k, v


def _assert_attention_matches_torch(ops: DecodeOps, meta: AttentionMetadata, heads: int,
                                    kv_heads: int, hd: int, block_size: int, num_blocks: int,
                                    dtype: torch.dtype = torch.float32) -> None:
    n = len(meta.slot_mapping)
    q, k, v = _step_qkv(n, heads, kv_heads, hd)
    k_cache, v_cache = _filled_caches(num_blocks, block_size, kv_heads, hd, dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    got = ops.paged_attention(q, k, v, k_cache, v_cache, meta, hd ** -0.5)
    meta.decode_workspace = None
    want = torch_ref.paged_attention(q, k, v, k_ref, v_ref, meta, hd ** -0.5)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@ISAS
@pytest.mark.parametrize("heads,kv_heads", [(HEADS, KV_HEADS), (4, 4)], ids=["gqa3", "mha"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_attention_reads_the_paged_cache_like_torch(ops, heads, kv_heads, dtype):
    torch.manual_seed(5)
    # Inside one block, on its last slot, one past a boundary, and several blocks long.
    meta = _decode_metadata([100, 33, 17, 16, 15, 1], block_size=16, num_blocks=40, groups=2)
    _assert_attention_matches_torch(ops, meta, heads, kv_heads, HEAD_DIM, 16, 40, dtype)


@ISAS
@pytest.mark.parametrize("group", [5, 7, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_query_heads_sharing_a_kv_head_get_the_bits_they_get_alone(ops, group, dtype):
    """The heads of a group are read together (each key and value piece loaded once for up to
    four of them): runs of four and the rest, each head as if its KV head were its own."""
    torch.manual_seed(8)
    meta = _decode_metadata([70, 37, 4], block_size=16, num_blocks=12)
    n = len(meta.slot_mapping)
    q, k, v = _step_qkv(n, group, 1, HEAD_DIM)
    k_cache, v_cache = _filled_caches(12, 16, 1, HEAD_DIM, dtype)
    alone = [k_cache.repeat(1, 1, group, 1), v_cache.repeat(1, 1, group, 1)]
    together = ops.paged_attention(q, k, v, k_cache, v_cache, meta, HEAD_DIM ** -0.5)
    meta.decode_workspace = None
    separate = ops.paged_attention(q, k.repeat(1, group, 1), v.repeat(1, group, 1), *alone, meta,
                                   HEAD_DIM ** -0.5)
    assert torch.equal(together, separate)


@ISAS
def test_decode_attention_with_odd_block_and_head_sizes(ops):
    torch.manual_seed(6)
    meta = _decode_metadata([23, 5, 4], block_size=5, num_blocks=12)
    _assert_attention_matches_torch(ops, meta, 6, 2, 12, 5, 12)


def test_decode_attention_of_heads_wider_than_the_c_kernel_reads_is_torchs(lib):
    """Gemma 4's global heads of 512: beyond decode_ops.c's MAX_HEAD_DIM, torch_ref attends."""
    torch.manual_seed(9)
    hd = 2 * decode_ops.MAX_HEAD_DIM
    meta = _decode_metadata([40, 3], block_size=16, num_blocks=8)
    _assert_attention_matches_torch(lib, meta, 4, 1, hd, 16, 8)


@ISAS
def test_decode_attention_keeps_to_the_sliding_window(ops):
    torch.manual_seed(7)
    meta = _decode_metadata([70, 40, 24, 10], block_size=16, num_blocks=20, window=24)
    _assert_attention_matches_torch(ops, meta, HEADS, KV_HEADS, HEAD_DIM, 16, 20)


def test_softcapped_decode_attention_is_torchs_capped_attention(lib):
    """The C kernel has no cap: a softcapped step attends through torch_ref, capped."""
    torch.manual_seed(10)
    meta = _decode_metadata([40, 17, 3], block_size=16, num_blocks=8)
    q, k, v = _step_qkv(len(meta.slot_mapping), HEADS, KV_HEADS, HEAD_DIM)
    q = q * 4  # scores well past the cap
    k_cache, v_cache = _filled_caches(8, 16, KV_HEADS, HEAD_DIM, torch.float32)
    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(3)]
    got = lib.paged_attention(q, k, v, *caches[0], meta, HEAD_DIM ** -0.5, softcap=2.0)
    meta.decode_workspace = None
    want = torch_ref.paged_attention(q, k, v, *caches[1], meta, HEAD_DIM ** -0.5, softcap=2.0)
    meta.decode_workspace = None
    uncapped = lib.paged_attention(q, k, v, *caches[2], meta, HEAD_DIM ** -0.5)
    assert torch.equal(got, want) and torch.equal(caches[0][0], caches[1][0])
    assert (got - uncapped).abs().max() > 0.1


@pytest.fixture
def two_threads(monkeypatch):
    """Attention on two threads whatever its size; one sequence's keys then split in two."""
    monkeypatch.setattr(decode_ops, "PARALLEL_MIN_SCORES", 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("kv_heads", [KV_HEADS, 1], ids=["gqa3", "mqa-keys-split"])
@pytest.mark.parametrize("context_lens", [[900], [900, 517], [300, 2]])
def test_decode_attention_across_threads_and_key_splits(lib, two_threads, context_lens,
                                                        kv_heads):
    """One kv head: fewer (sequence, kv head) pairs than threads, so a sequence's keys split."""
    torch.manual_seed(8)
    meta = _decode_metadata(context_lens, block_size=16, num_blocks=100)
    _assert_attention_matches_torch(lib, meta, HEADS, kv_heads, HEAD_DIM, 16, 100)


@pytest.mark.parametrize("context_lens", [[900], [300, 2], [600, 450, 31]])
def test_a_sequence_with_a_kv_head_for_every_thread_gets_one_threads_bits(lib, monkeypatch,
                                                                        context_lens):
    """Its keys are not split: alone or batched, on one thread or two, a sequence's attention
    is the same sum in the same order, so its tokens do not depend on either."""
    torch.manual_seed(10)
    meta = _decode_metadata(context_lens, block_size=16, num_blocks=120)
    n = len(context_lens)
    q, k, v = _step_qkv(n, HEADS, KV_HEADS, HEAD_DIM)
    caches = _filled_caches(120, 16, KV_HEADS, HEAD_DIM, torch.float32)
    outputs = []
    threads = torch.get_num_threads()
    monkeypatch.setattr(decode_ops, "PARALLEL_MIN_SCORES", 0)
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            k_cache, v_cache = caches[0].clone(), caches[1].clone()
            outputs.append(lib.paged_attention(q, k, v, k_cache, v_cache, meta, 0.125).clone())
            meta.decode_workspace = None
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outputs[0], outputs[1])


def test_a_steps_decode_groups_together_decide_whether_attention_takes_every_thread(
        monkeypatch):
    """32 sequences of 100-400 tokens come as four groups, none wide enough alone: attended on
    one thread each, they left the second core idle through a fifth of a 32-stream step."""
    meta = _decode_metadata([400, 300, 250, 200, 150, 120, 110, 100], block_size=16,
                            num_blocks=160, groups=4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    group_scores = [HEADS * (g.end - g.start) * g.block_tables.shape[1] * 16
                    for g in meta.decode_groups]
    monkeypatch.setattr(decode_ops, "PARALLEL_MIN_SCORES", max(group_scores) + 1)
    assert all(decode_ops.attention_threads(HEADS, 16, [g]) == 1 for g in meta.decode_groups)
    assert decode_ops.attention_threads(HEADS, 16, meta.decode_groups) == 2
    monkeypatch.setattr(decode_ops, "PARALLEL_MIN_SCORES", sum(group_scores) + 1)
    assert decode_ops.attention_threads(HEADS, 16, meta.decode_groups) == 1
    assert decode_ops.attention_threads(HEADS, 16, []) == 1


def test_prefill_segments_in_the_same_step_attend_through_torch(lib):
    torch.manual_seed(9)
    meta = _decode_metadata([30, 7], block_size=16, num_blocks=12)
    # A fresh 6-token prompt on blocks the decodes do not use.
    used = {int(b) for g in meta.decode_groups for b in g.block_tables.flatten()}
    free = [b for b in range(12) if b not in used][:1]
    meta.slot_mapping = torch.cat((meta.slot_mapping, torch.arange(6) + free[0] * 16))
    meta.prefills = [PrefillSegment(2, 8, 6, torch.tensor(free), None)]
    _assert_attention_matches_torch(lib, meta, HEADS, KV_HEADS, HEAD_DIM, 16, 12)


def test_a_block_id_outside_the_cache_is_refused(lib):
    meta = _decode_metadata([20], block_size=16, num_blocks=4)
    meta.decode_groups[0].block_tables[0, 1] = 4
    q, k, v = _step_qkv(1, HEADS, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = _filled_caches(4, 16, KV_HEADS, HEAD_DIM, torch.float32)
    with pytest.raises(ValueError, match="pg_decode_attention"):
        lib.paged_attention(q, k, v, k_cache, v_cache, meta, 0.125)


def test_a_decode_group_past_the_steps_queries_is_refused(lib):
    meta = _decode_metadata([20, 10], block_size=16, num_blocks=4)
    q, k, v = _step_qkv(1, HEADS, KV_HEADS, HEAD_DIM)
    meta.slot_mapping = meta.slot_mapping[:1]
    k_cache, v_cache = _filled_caches(4, 16, KV_HEADS, HEAD_DIM, torch.float32)
    with pytest.raises(ValueError, match="decode group"):
        lib.paged_attention(q, k, v, k_cache, v_cache, meta, 0.125)


def test_a_norm_weight_of_another_width_is_not_read_past_its_end(lib):
    with pytest.raises(RuntimeError):
        lib.rms_norm(torch.randn(1, 64), torch.randn(32), EPS)


def test_other_dtypes_fall_back_to_torch(lib):
    x, w = torch.randn(2, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    assert torch.equal(lib.rms_norm(x, w, EPS), torch_ref.rms_norm(x, w, EPS))


def test_cpu_ops_come_from_the_library_when_it_loads(lib):
    cpu = torch.device("cpu")
    ops = select_ops(cpu, "torch", lambda name: lib._lib if name == "decode_ops" else None)
    assert ops.name == "torch" and ops.paged_attention != TORCH_OPS.paged_attention
    assert ops.gelu_tanh_and_mul != TORCH_OPS.gelu_tanh_and_mul
    assert select_ops(cpu, "torch", lambda name: None) is TORCH_OPS


@ISAS
def test_top_k_of_a_row_in_ascending_order_is_still_the_largest(ops):
    x = torch.randn(3, 20000).sort(dim=-1).values  # every value a new largest: torch's instead
    assert _as_sets(ops.top_k_indices(x, 32)) == [set(range(19968, 20000))] * 3


# The mixture-of-experts router: the eager CPU path and the one-call step both route through it.
ROUTINGS = {"softmax": ("softmax", False, False), "softmax renormalised": ("softmax", True, False),
            "sigmoid": ("sigmoid", False, False), "sigmoid renormalised": ("sigmoid", True, False),
            "gpt-oss: softmax after top-k": ("softmax", False, True)}
# The router's dot products have an AVX2 body and a scalar one (no AVX-512 one).
ROUTER_ISAS = pytest.mark.parametrize("isa", [SCALAR, AVX2], ids=["scalar", "avx2"])


@ROUTER_ISAS
@pytest.mark.parametrize("routing", ROUTINGS.values(), ids=ROUTINGS.keys())
@pytest.mark.parametrize("hidden", [256, 100])
def test_route_picks_torchs_experts_best_first_with_its_weights(ops, routing, hidden):
    g = torch.Generator().manual_seed(hidden)
    x, router = torch.randn(6, hidden, generator=g), 0.3 * torch.randn(16, hidden, generator=g)
    bias = torch.randn(16, generator=g)
    weights, ids = ops.route(x, router, bias, 4, *routing)
    want_weights, want_ids = torch_ref.route(x, router, bias, 4, *routing)
    assert torch.equal(ids, want_ids)  # no near-ties among these logits
    torch.testing.assert_close(weights, want_weights)


@ROUTER_ISAS
def test_route_breaks_a_tie_for_the_lower_expert(ops):
    """A router of equal rows scores every expert alike: experts 0..k-1, in order."""
    x = torch.randn(3, 64)
    router = torch.randn(1, 64).expand(8, 64).contiguous()
    weights, ids = ops.route(x, router, None, 3, "softmax", True, False)
    assert ids.tolist() == [[0, 1, 2]] * 3
    torch.testing.assert_close(weights, torch.full((3, 3), 1 / 3))


def test_a_large_router_gives_each_row_its_own_routing_on_any_thread_count(lib):
    """A Qwen3-30B-A3B-sized router (128 x 2048) dots its experts on the whole team, rows a
    chunk at a time: 37 rows (two whole chunks and a part) get the bits each row gets alone,
    on one thread or two."""
    g = torch.Generator().manual_seed(3)
    x, router = torch.randn(37, 2048, generator=g), 0.02 * torch.randn(128, 2048, generator=g)
    bias = torch.randn(128, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        batch = lib.route(x, router, bias, 8, "softmax", True, False)
        torch.set_num_threads(1)
        alone = [lib.route(x[t:t + 1], router, bias, 8, "softmax", True, False)
                 for t in range(37)]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(batch[1], torch.cat([ids for _, ids in alone]))
    assert torch.equal(batch[0], torch.cat([weights for weights, _ in alone]))
    want_weights, want_ids = torch_ref.route(x, router, bias, 8, "softmax", True, False)
    assert torch.equal(batch[1].sort(dim=1).values, want_ids.sort(dim=1).values)
    torch.testing.assert_close(batch[0], want_weights)


def test_route_beyond_the_kernels_reach_is_torchs(lib):
    x, router = torch.randn(2, 32, dtype=torch.float64), torch.randn(8, 32, dtype=torch.float64)
    weights, ids = lib.route(x, router, None, 2, "softmax", False, False)
    want_weights, want_ids = torch_ref.route(x, router, None, 2, "softmax", False, False)
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)


@ROUTER_ISAS
def test_a_shared_expert_behind_its_sigmoid_gate_is_added_as_torch_adds_it(ops):
    g = torch.Generator().manual_seed(7)
    routed, shared, x = (torch.randn(3, 96, generator=g) for _ in range(3))
    gate = torch.randn(1, 96, generator=g)
    torch.testing.assert_close(ops.add_sigmoid_gated(routed, shared, x, gate),
                               torch_ref.add_sigmoid_gated(routed, shared, x, gate))
