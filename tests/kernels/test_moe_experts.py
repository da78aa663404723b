"""moe_experts runs a mixture-of-experts layer's routed experts from GGUF blocks read in place
(pagoda/kernels/cpu/moe_experts.c): each type's product is its quantized activations times gguf-py's
own weight, the layer is the float layer within int8 activations' rounding, and a row's output
is the same bits whatever rows, instruction set or thread count share its step."""

import numpy as np
import pytest
import torch
from block_quant_reference import activations, runnable
from expert_blocks import EXPERT_TYPES, expert_blocks, gguf_values

from pagoda.kernels.cpu.moe_experts import BLOCKS, MoeExperts, Projection
from pagoda.kernels.cpu.native import find_compiler

SCALAR, AVX2, AVX512_VNNI = 0, 1, 2
ISAS = pytest.mark.parametrize("isa", [SCALAR, AVX2, AVX512_VNNI],
                               ids=["scalar", "avx2", "avx512-vnni"])
VECTOR_ISAS = pytest.mark.parametrize("isa", [AVX2, AVX512_VNNI], ids=["avx2", "avx512-vnni"])
TYPES = pytest.mark.parametrize("kind", EXPERT_TYPES)
EXPERTS, TOP_K, HIDDEN = 6, 2, 512


@pytest.fixture(scope="module")
def moe(kernel_build_dir) -> MoeExperts:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/moe_experts.c")
    return MoeExperts.load(kernel_build_dir)


def _rows(kind: str, n: int, k: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(expert_blocks(kind, n, k, seed))


def _inter(kind: str) -> int:
    """An intermediate width that is whole blocks of the type, and not a multiple of the
    kernel's 16-row work items for the types of 32."""
    return 256 if BLOCKS[kind][0] == 256 else 96


def _experts(kind: str, inter: int, biases: bool = False, seed: int = 0, hidden: int = HIDDEN):
    """(gate, up, down) Projections of EXPERTS random experts of one type."""
    projections = []
    for p, (n, k) in enumerate([(inter, hidden), (inter, hidden), (hidden, inter)]):
        rows = [_rows(kind, n, k, seed=100 * seed + 10 * p + e) for e in range(EXPERTS)]
        bias = [torch.randn(n, generator=torch.Generator().manual_seed(p * 7 + e)) * 0.1
                for e in range(EXPERTS)] if biases else None
        projections.append(Projection(rows, kind, bias))
    return projections


def _routing(m: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(m)])
    weights = torch.softmax(torch.randn(m, TOP_K, generator=g), dim=-1)
    return ids.contiguous(), weights.contiguous()


def _rounded(moe, v: torch.Tensor, kind: str) -> torch.Tensor:
    """v's rows as the kernel's int8 activations for weights of kind stand for them."""
    xq, scale, _ = moe.quantize_rows(v.float().view(1, -1), kind)
    return (xq.double() * scale.double().repeat_interleave(32, dim=1)).view(-1)


def _float_layer(moe, x, ids, weights, projections, activation):
    """The layer in float64 on gguf-py's values of every expert's blocks, each projection's
    input rounded as the kernel's int8 activations are (x by gate's type, the intermediate
    rows by down's)."""
    gate, up, down = ([gguf_values(p.type_name, r).double() for r in p.rows] for p in projections)
    biases = [p.biases for p in projections]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for r in range(x.shape[0]):
        xr = _rounded(moe, x[r], projections[0].type_name)
        for s in range(ids.shape[1]):
            e = int(ids[r, s])
            g, u = xr @ gate[e].T, xr @ up[e].T
            if biases[0] is not None:
                g, u = g + biases[0][e], u + biases[1][e]
            if activation == "silu":
                h = torch.nn.functional.silu(g) * u
            else:
                g, u = g.clamp(max=7), u.clamp(-7, 7)
                h = (u + 1) * g * torch.sigmoid(1.702 * g)
            y = _rounded(moe, h, projections[2].type_name) @ down[e].T
            if biases[2] is not None:
                y = y + biases[2][e]
            out[r] += float(weights[r, s]) * y
    return out


@TYPES
@ISAS
def test_each_types_product_is_quantized_activations_times_ggufs_own_weight(moe, kind, isa):
    isa = runnable(moe, isa)
    rows = _rows(kind, 9, 512, seed=1)
    weight = gguf_values(kind, rows).double().unsqueeze(0)
    for m in range(1, 6):  # four activation rows a pass, then one
        x = activations(m, 512, seed=m)
        xq, scale, _ = moe.quantize_rows(x, kind, isa)
        y = moe.linear(rows, kind, x, isa)
        terms = (xq.double() * scale.double().repeat_interleave(32, dim=1)).unsqueeze(1) * weight
        want, bound = terms.sum(-1), terms.abs().sum(-1)
        assert (y.double() - want).abs().le(bound * 2e-6 + 1e-30).all(), m


def _largest(kind: str, n: int, k: int) -> torch.Tensor:
    """Rows whose every value and scale is at its largest magnitude: maddubs' pairs then reach
    2 x 128 x 127 (Q8_0's -128), and a super-block's int32 sums their most."""
    values, size = BLOCKS[kind]
    b = np.zeros((n, k // values, size), dtype=np.uint8)
    d = np.array([1e-3], dtype=np.float16).view(np.uint8)
    if kind == "Q8_0":
        b[..., 2:] = 0x80  # -128
    elif kind == "MXFP4":
        b[..., 0], b[..., 1:] = 120, 0xFF  # -12
    elif kind in ("Q4_K", "Q5_K"):
        b[..., 4:] = 0xFF  # six-bit scales and mins 63, values 15 / 31
    elif kind == "Q6_K":
        b[..., 192:208] = 0x80  # scales -128, values 0 - 32
    # Q4_0 (nibbles 0: -8), IQ4_XS (-127, scale -32), Q3_K (-4, scale -32): all bits clear
    at = {"Q6_K": 208, "Q3_K": 108, "MXFP4": None}.get(kind, 0)
    if at is not None:
        b[..., at:at + 2] = d
    return torch.from_numpy(b.reshape(n, -1))


@TYPES
@pytest.mark.parametrize("isa", [SCALAR, AVX2], ids=["scalar", "avx2"])
def test_largest_weights_and_activations_do_not_wrap(moe, kind, isa):
    isa = runnable(moe, isa)
    rows = _largest(kind, 4, 512)
    x = torch.full((2, 512), 3.0)
    x[1] = -3.0
    xq, scale, _ = moe.quantize_rows(x, kind, isa)
    want = (xq.double() * scale.double().repeat_interleave(32, dim=1)) @ gguf_values(kind, rows).double().T
    y = moe.linear(rows, kind, x, isa).double()
    assert torch.allclose(y, want, rtol=1e-5, atol=0), (y, want)


@TYPES
def test_layer_is_the_float_layer_on_its_int8_activations(moe, kind):
    projections = _experts(kind, _inter(kind))
    layer = moe.layer(*projections)
    x = activations(5, HIDDEN, seed=7)
    ids, weights = _routing(5, seed=1)
    got = moe.forward(layer, x, ids, weights).double()
    want = _float_layer(moe, x, ids, weights, projections, "silu")
    assert ((got - want).norm(dim=-1) / want.norm(dim=-1)).max() < 1e-5


def test_gpt_oss_clamped_swiglu_with_biases_is_the_float_layer(moe):
    """At gpt-oss's hidden width, 2880: whole blocks of 32, not of 256."""
    projections = _experts("MXFP4", 96, biases=True, seed=3, hidden=2880)
    layer = moe.layer(*projections, activation="swiglu_oai", limit=7.0,
                      alpha=1.702)
    x = activations(4, 2880, seed=8) * 4  # gate values past the clamp at 7
    ids, weights = _routing(4, seed=2)
    got = moe.forward(layer, x, ids, weights).double()
    want = _float_layer(moe, x, ids, weights, projections, "swiglu_oai")
    assert ((got - want).norm(dim=-1) / want.norm(dim=-1)).max() < 1e-5


@pytest.mark.parametrize("kind", ["Q4_K", "MXFP4"])
def test_rows_to_overlapping_and_disjoint_experts_get_what_they_get_alone(moe, kind):
    layer = moe.layer(*_experts(kind, _inter(kind)))
    # rows 0 and 1 share both experts, 2 one of them, 3 none, 4 repeats row 0's in the other order
    ids = torch.tensor([[0, 1], [1, 0], [1, 4], [2, 3], [0, 1], [5, 2], [4, 0]])
    weights = torch.softmax(torch.randn(7, TOP_K, generator=torch.Generator().manual_seed(5)), -1)
    x = activations(7, HIDDEN, seed=9)
    batch = moe.forward(layer, x, ids, weights, threads=2)
    for r in range(7):
        alone = moe.forward(layer, x[r:r + 1].contiguous(), ids[r:r + 1].contiguous(),
                            weights[r:r + 1].contiguous())
        assert torch.equal(batch[r:r + 1], alone), r


@TYPES
@VECTOR_ISAS
def test_vector_bodies_give_the_scalar_fallbacks_bits(moe, kind, isa):
    runnable(moe, isa)
    layer = moe.layer(*_experts(kind, _inter(kind), biases=True))
    x = activations(6, HIDDEN, seed=4)
    ids, weights = _routing(6, seed=3)
    assert torch.equal(moe.forward(layer, x, ids, weights, isa=isa),
                       moe.forward(layer, x, ids, weights, isa=SCALAR))


@TYPES
def test_projection_vector_body_gives_the_scalar_bits_for_each_activation_row_count(moe, kind):
    """Nine weight rows, one to five activation rows; for the types of 32 a width of 9 blocks:
    one run of eight blocks whose scales go in one vector (MXFP4), then a block alone."""
    runnable(moe, AVX2)
    k = 288 if BLOCKS[kind][0] == 32 else 512
    rows = _rows(kind, 9, k, seed=6)
    x = activations(5, k, seed=11)
    for m in range(1, 6):
        assert torch.equal(moe.linear(rows, kind, x[:m], AVX2),
                           moe.linear(rows, kind, x[:m], SCALAR)), m


@pytest.mark.parametrize("blocks", [3, 8, 15, 17, 90])
@VECTOR_ISAS
def test_mxfp4_subnormal_scales_and_short_tails_give_the_scalar_bits_and_ggufs_values(moe, blocks,
                                                                                     isa):
    """MXFP4 rows 8 blocks at a time (VNNI's dpbusd there), then a tail of 3 or 7 or 1 or 2 (or
    nothing): exponents 0 and 1 (subnormal scales 2^-128, 2^-127) in some rows only, which the
    vector body takes through its slower exact pass, beside rows of normal ones, each row's the
    scalar bits and gguf-py's values."""
    runnable(moe, isa)
    k = 32 * blocks
    rows = _rows("MXFP4", 6, k, seed=blocks)
    exponents = rows.view(6, blocks, 17)[..., 0]
    exponents[1, 0], exponents[3, -1], exponents[4, blocks // 2] = 0, 1, 0
    exponents[5] = torch.arange(blocks) % 2  # every scale subnormal
    weight = gguf_values("MXFP4", rows).double().unsqueeze(0)
    for m in range(1, 6):
        x = activations(m, k, seed=m)
        y = moe.linear(rows, "MXFP4", x, isa)
        assert torch.equal(y, moe.linear(rows, "MXFP4", x, SCALAR)), m
        xq, scale, _ = moe.quantize_rows(x, "MXFP4")
        terms = (xq.double() * scale.double().repeat_interleave(32, dim=1)).unsqueeze(1) * weight
        want, bound = terms.sum(-1), terms.abs().sum(-1)
        normal = [0, 1, 2, 3, 4]
        assert (y.double() - want)[:, normal].abs().le(bound[:, normal] * 2e-6).all(), m
        assert (y[:, 5].double() - want[:, 5]).abs().le(bound[:, 5] * 1e-2 + 1e-44).all(), m


def test_two_threads_give_one_threads_bits(moe):
    layer = moe.layer(*_experts("Q4_K", 256))
    x = activations(9, HIDDEN, seed=5)
    ids, weights = _routing(9, seed=4)
    assert torch.equal(moe.forward(layer, x, ids, weights, threads=2),
                       moe.forward(layer, x, ids, weights, threads=1))


def test_mixed_types_per_projection(moe):
    """Q4_K_M files keep some layers' down experts in Q6_K beside Q4_K gate and up."""
    gate, up, _ = _experts("Q4_K", 256)
    down = _experts("Q6_K", 256, seed=2)[2]
    layer = moe.layer(gate, up, down)
    x = activations(3, HIDDEN, seed=6)
    ids, weights = _routing(3, seed=5)
    got = moe.forward(layer, x, ids, weights).double()
    want = _float_layer(moe, x, ids, weights, (gate, up, down), "silu")
    assert ((got - want).norm(dim=-1) / want.norm(dim=-1)).max() < 1e-5


def test_a_step_without_rows_gives_no_rows(moe):
    layer = moe.layer(*_experts("Q8_0", 96))
    out = moe.forward(layer, torch.empty(0, HIDDEN), torch.empty(0, TOP_K, dtype=torch.int64),
                      torch.empty(0, TOP_K))
    assert out.shape == (0, HIDDEN)


def test_refuses_what_it_cannot_read(moe):
    gate, up, down = _experts("Q8_0", 96)
    with pytest.raises(ValueError, match="one weight per expert"):
        moe.layer(gate, up, Projection(down.rows[:-1], "Q8_0"))
    with pytest.raises(ValueError, match="rows must be contiguous uint8"):
        moe.layer(gate, up, Projection([r[:, :-34] for r in down.rows], "Q8_0"))
    with pytest.raises(ValueError, match="not Q5_0"):
        moe.layer(gate, up, Projection(down.rows, "Q5_0"))
    mxfp4_up = _experts("MXFP4", 96)[1]  # x laid out for MXFP4 is not Q8_0's
    with pytest.raises(ValueError, match="both MXFP4"):
        moe.layer(gate, mxfp4_up, down)
    layer = moe.layer(gate, up, down)
    x = activations(1, HIDDEN)
    with pytest.raises(ValueError, match="expert id out of range"):
        moe.forward(layer, x, torch.tensor([[0, EXPERTS]]), torch.ones(1, TOP_K))
