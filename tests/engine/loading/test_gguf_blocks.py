"""Our decoding of the GGUF types without a kernel gives gguf-py's values to the bit, and widens
them to int8 exactly where the type is small integers times a factor per 32 values, else within
half a step."""

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from tiny_gguf import random_blocks

from pagoda.engine.loading import gguf_blocks
from pagoda.engine.loading.gguf_blocks import DECODED_TYPES, EXACT_TYPES, dequantize_rows, widen_to_int8
from pagoda.engine.loading.layouts import GGUF_WIDENED_TYPES
from pagoda.engine.quantization.tensors import dequantize

ROWS, COLS = 8, 1024  # several rows of several blocks (4 super-blocks, or 32 blocks of 32)
# Types gguf-py can quantize: real blocks from float weights. The others: random bytes with
# small, finite fp16 scales.
QUANTIZABLE = frozenset({QType.Q5_0, QType.Q5_1, QType.MXFP4})
TYPES = sorted(DECODED_TYPES)


def raw_rows(kind: QType, rows: int = ROWS, cols: int = COLS, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind in QUANTIZABLE:
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), kind)
    return random_blocks(kind, rows, cols, rng)


def test_every_type_the_loader_widens_is_decoded_here():
    assert {kind.name for kind in DECODED_TYPES} == GGUF_WIDENED_TYPES


@pytest.mark.parametrize("kind", TYPES, ids=lambda k: k.name)
def test_each_type_decodes_to_ggufs_values_bit_for_bit(kind):
    raw = raw_rows(kind)
    expected = gguf.quants.dequantize(raw, kind)
    got = dequantize_rows(raw, kind)
    assert got.shape == (ROWS, COLS) and got.dtype == np.float32
    assert np.isfinite(expected).all() and np.abs(expected).max() > 0
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("kind", [QType.Q3_K, QType.IQ4_XS, QType.IQ2_S, QType.IQ1_M],
                         ids=lambda k: k.name)
def test_every_bit_set_decodes_as_gguf_does(kind):
    # The top values of every packed field (6-bit scales split over bytes, index tops, signs).
    raw = raw_rows(kind)
    _, type_size = gguf.GGML_QUANT_SIZES[kind]
    blocks = raw.reshape(ROWS, -1, type_size)
    scale_bytes = {QType.Q3_K: slice(96, 108), QType.IQ4_XS: slice(2, 8),
                   QType.IQ2_S: slice(34, 82), QType.IQ1_M: slice(32, 48)}[kind]
    blocks[0, 0, scale_bytes] = 0xFF
    expected = gguf.quants.dequantize(raw, kind)
    assert np.array_equal(dequantize_rows(raw, kind), expected)


def test_a_one_dimensional_tensor_decodes_to_one_dimension():
    raw = raw_rows(QType.IQ4_NL, rows=1).reshape(-1)
    assert np.array_equal(dequantize_rows(raw, QType.IQ4_NL),
                          gguf.quants.dequantize(raw, QType.IQ4_NL))


@pytest.mark.parametrize("kind", sorted(EXACT_TYPES), ids=lambda k: k.name)
def test_widening_keeps_every_value_of_a_type_of_one_factor_per_32(kind):
    raw = raw_rows(kind)
    weight = widen_to_int8(raw, kind)
    assert weight.group_size == 32 and weight.q.dtype == torch.int8
    # q * scale + min, rounded after each step as ggml does (torch's addcmul fuses the two).
    values = weight.q.numpy().astype(np.float32) * np.repeat(weight.scales.numpy(), 32, axis=1)
    if weight.mins is not None:
        values = values + np.repeat(weight.mins.numpy(), 32, axis=1)
    assert np.array_equal(values, gguf.quants.dequantize(raw, kind))


@pytest.mark.parametrize("kind", sorted(DECODED_TYPES - EXACT_TYPES), ids=lambda k: k.name)
def test_widening_moves_each_value_by_at_most_half_an_int8_step(kind):
    raw = raw_rows(kind)
    weight = widen_to_int8(raw, kind)
    assert weight.group_size == 32 and weight.q.dtype == torch.int8
    exact = torch.from_numpy(dequantize_rows(raw, kind))
    half_step = weight.scales.repeat_interleave(32, dim=1) / 2
    assert ((dequantize(weight) - exact).abs() <= half_step * 1.001).all()


@pytest.mark.parametrize("kind", [QType.IQ2_S, QType.IQ3_S, QType.Q5_K], ids=lambda k: k.name)
def test_widening_a_slice_of_rows_at_a_time_gives_the_whole_tensors_weight(monkeypatch, kind):
    raw = raw_rows(kind)
    whole = widen_to_int8(raw, kind)
    monkeypatch.setattr(gguf_blocks, "_WIDEN_SLICE_VALUES", 3 * COLS)  # 3 rows, then 3, then 2
    sliced = widen_to_int8(raw, kind)
    assert torch.equal(sliced.q, whole.q) and torch.equal(sliced.scales, whole.scales)
    assert (sliced.mins is None and whole.mins is None) or torch.equal(sliced.mins, whole.mins)


def test_q3_k_widens_its_largest_product_exactly():
    # Scale -32 (every scale bit clear) times value -4 (every value and high bit clear): 128,
    # one past int8's top, held negated.
    raw = raw_rows(QType.Q3_K)
    blocks = raw.reshape(ROWS, -1, 110)
    blocks[0, 0, :108] = 0
    weight = widen_to_int8(raw, QType.Q3_K)
    assert weight.q[0, :256].eq(-128).all()
    expected = torch.from_numpy(gguf.quants.dequantize(raw, QType.Q3_K))
    assert torch.equal(dequantize(weight), expected)


def test_mxfp4_decodes_at_every_exponent_as_gguf_does():
    """gpt-oss's experts: an e8m0 exponent per 32 values, from 2^-128 (a subnormal float32
    scale) to 2^127 (whose larger values overflow to infinity, in gguf-py too)."""
    raw = raw_rows(QType.MXFP4)  # 8 rows of 32 blocks: 256 blocks, one per exponent
    raw.reshape(-1, 17)[:, 0] = np.arange(256, dtype=np.uint8)
    with np.errstate(over="ignore"):
        expected = gguf.quants.dequantize(raw, QType.MXFP4)
        got = dequantize_rows(raw, QType.MXFP4)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
