"""moe_tiles runs a mixture-of-experts layer's routed experts for steps of many rows an expert
(pagoda/kernels/cpu/moe_tiles.c): the layer is the float layer on gguf-py's own weights within its
int8 activations' rounding, the largest weights and activations do not wrap its integer lanes,
and a row's output is the same bits whatever rows or thread count share its step."""

import pytest
import torch
from block_quant_reference import activations
from test_moe_experts import _experts, _float_layer, _inter, _largest, _routing

from pagoda.kernels.cpu.moe_experts import BLOCKS, MoeExperts, Projection
from pagoda.kernels.cpu.moe_tiles import TYPES, MoeTiles
from pagoda.kernels.cpu.native import find_compiler

HIDDEN = 512  # tests/kernels/test_moe_experts.py's width, whose experts these are


@pytest.fixture(scope="module")
def moe(kernel_build_dir) -> MoeExperts:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/moe_tiles.c")
    return MoeExperts.load(kernel_build_dir)


@pytest.fixture(scope="module")
def tiles(moe, kernel_build_dir) -> MoeTiles:
    kernel = MoeTiles.load(kernel_build_dir)
    if not kernel.supports(moe.layer(*_experts("Q4_K", 256)), 2):
        pytest.skip("moe_tiles needs AVX2, FMA and F16C")
    return kernel


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Over rows; a row of zeros (SiLU of a very negative gate) must come out zeros."""
    return float(((got.double() - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)).max())


@pytest.mark.parametrize("kind", TYPES)
def test_layer_is_the_float_layer_on_its_int8_activations(moe, tiles, kind):
    """Nine rows over six experts: groups of four activation rows and a remainder, and tiles
    of 16 weight rows with a partial last one (96 rows for the types of 32)."""
    projections = _experts(kind, _inter(kind))
    layer = moe.layer(*projections)
    x = activations(9, HIDDEN, seed=7)
    ids, weights = _routing(9, seed=1)
    want = _float_layer(moe, x, ids, weights, projections, "silu")
    assert _relative_error(tiles.forward(layer, x, ids, weights), want) < 1e-5


@pytest.mark.parametrize("kind", ["MXFP4", "Q4_0"])
def test_gpt_oss_clamped_swiglu_with_biases_at_2880_is_the_float_layer(moe, tiles, kind):
    """2880 inputs: 90 blocks of 32, not whole eights of them (the last eight partial)."""
    projections = _experts(kind, 96, biases=True, seed=3, hidden=2880)
    layer = moe.layer(*projections, activation="swiglu_oai", limit=7.0, alpha=1.702)
    x = activations(5, 2880, seed=8) * 4  # gate values past the clamp at 7
    ids, weights = _routing(5, seed=2)
    want = _float_layer(moe, x, ids, weights, projections, "swiglu_oai")
    assert _relative_error(tiles.forward(layer, x, ids, weights, threads=2), want) < 1e-5


def _largest_stored(kind: str, n: int, k: int) -> torch.Tensor:
    """test_moe_experts' largest rows, with the signed types at their largest as stored here
    (value + offset): MXFP4's +12 (24), Q4_0's +7 (15), Q6_K's +31 (63, at scale -128)."""
    values, size = BLOCKS[kind]
    rows = _largest(kind, n, k).view(n, k // values, size)
    if kind == "MXFP4":
        rows[..., 1:] = 0x77
    elif kind == "Q4_0":
        rows[..., 2:] = 0xFF
    elif kind == "Q6_K":
        rows[..., :192] = 0xFF
    return rows.reshape(n, -1)


@pytest.mark.parametrize("kind", TYPES)
def test_largest_weights_and_activations_do_not_wrap(moe, tiles, kind):
    """Every weight and scale at its largest (Q4_K's and Q5_K's 15 / 31 at scale 63, MXFP4's
    12 stored as 24, Q4_0's 7 as 15, Q6_K's 31 as 63 at scale -128), activations at +-127: maddubs' pairs and the
    super-blocks' int32 sums at their most."""
    inter = _inter(kind)
    projections = [Projection([_largest_stored(kind, n, k)] * 2, kind)
                   for n, k in ((inter, HIDDEN), (inter, HIDDEN), (HIDDEN, inter))]
    layer = moe.layer(*projections)
    x = torch.full((2, HIDDEN), 3.0)
    x[1] = -3.0
    ids = torch.tensor([[0, 1], [1, 0]])
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
    want = _float_layer(moe, x, ids, weights, projections, "silu")
    assert _relative_error(tiles.forward(layer, x, ids, weights), want) < 1e-5


@pytest.mark.parametrize("kind", ["Q4_K", "MXFP4"])
def test_a_rows_output_is_the_same_bits_in_any_step_and_on_any_thread_count(moe, tiles, kind):
    """Rows sharing both experts, one, none; more than four to an expert (two groups)."""
    layer = moe.layer(*_experts(kind, _inter(kind)))
    ids = torch.tensor([[0, 1], [1, 0], [1, 4], [2, 3], [0, 1], [5, 2], [4, 0], [1, 0],
                        [0, 5], [1, 2]])
    weights = torch.softmax(torch.randn(10, 2, generator=torch.Generator().manual_seed(5)), -1)
    x = activations(10, HIDDEN, seed=9)
    batch = tiles.forward(layer, x, ids, weights, threads=2)
    for r in range(10):
        alone = tiles.forward(layer, x[r:r + 1].contiguous(), ids[r:r + 1].contiguous(),
                              weights[r:r + 1].contiguous())
        assert torch.equal(batch[r:r + 1], alone), r


def test_refuses_what_it_cannot_read(moe, tiles):
    q8 = moe.layer(*_experts("Q8_0", 96))
    assert not tiles.supports(q8, 2)
    x = activations(2, HIDDEN, seed=1)
    ids, weights = _routing(2)
    with pytest.raises(ValueError, match="does not read"):
        tiles.forward(q8, x, ids, weights)
    layer = moe.layer(*_experts("Q4_K", 256))
    with pytest.raises(ValueError, match="expert id"):
        tiles.forward(layer, x, torch.tensor([[0, 6], [1, 2]]), weights)
    with pytest.raises(ValueError, match="topk_weights"):
        tiles.forward(layer, x, ids, weights.double())


def test_a_step_without_rows_gives_no_rows(moe, tiles):
    layer = moe.layer(*_experts("MXFP4", 96))
    got = tiles.forward(layer, torch.empty(0, HIDDEN), torch.empty(0, 2, dtype=torch.int64),
                        torch.empty(0, 2))
    assert got.shape == (0, HIDDEN)

