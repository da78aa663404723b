"""The grouped int8 weights a one-row step streams (a GGUF file's Q8_0 matrices, fused
projections) are made in transparent huge pages, where they are first written: the only copy."""

import gguf
import numpy as np
import torch
from huge_pages_smaps import needs_huge_pages, smaps_field

from pagoda.engine.loading.gguf import decode_q8_0
from pagoda.engine.quantization.tensors import Int8Weight, concat, dequantize
from pagoda.kernels.cpu.huge_pages import HUGE_PAGE

ROWS, COLUMNS = 384, 8192  # 3 MB of int8 values: one whole huge page at least


def _q8_0_rows(rows: int, columns: int, seed: int) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float32)
    return gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)


def _in_huge_page_memory(t: torch.Tensor) -> bool:
    page = t.data_ptr() + (-t.data_ptr() % HUGE_PAGE)
    return smaps_field(page, "THPeligible") == 1


def test_decoded_q8_0_rows_equal_gguf_py_dequantization():
    data = _q8_0_rows(ROWS, COLUMNS, seed=0)
    weight = decode_q8_0(data)
    expected = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(dequantize(weight), torch.from_numpy(expected))


def test_fused_int8_parts_keep_every_value_in_order():
    parts = [decode_q8_0(_q8_0_rows(rows, COLUMNS, seed)) for seed, rows in enumerate((256, 32))]
    fused = concat(parts)
    assert isinstance(fused, Int8Weight)
    assert torch.equal(fused.q, torch.cat([p.q for p in parts]))
    assert torch.equal(fused.scales, torch.cat([p.scales for p in parts]))


@needs_huge_pages
def test_a_q8_0_matrix_is_decoded_into_huge_page_memory():
    assert _in_huge_page_memory(decode_q8_0(_q8_0_rows(ROWS, COLUMNS, seed=0)).q)


@needs_huge_pages
def test_a_fused_int8_projection_is_stacked_into_huge_page_memory():
    parts = [decode_q8_0(_q8_0_rows(rows, COLUMNS, seed)) for seed, rows in enumerate((256, 128))]
    assert _in_huge_page_memory(concat(parts).q)
