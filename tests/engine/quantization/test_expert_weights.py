"""An MoE file's expert rows are kept in place (a view of the file's memory map) and decode to
exactly gguf-py's values where our expert kernel does not run."""

import gguf
import numpy as np
import pytest
import torch
from expert_blocks import EXPERT_TYPES, expert_blocks, gguf_values

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.quantization.expert_weights import IN_PLACE_EXPERT_TYPES, expert_weight
from pagoda.engine.quantization.tensors import GGUFRows, dequantize, select_rows


@pytest.mark.parametrize("kind", EXPERT_TYPES)
def test_every_expert_type_decodes_to_ggufs_values(kind):
    blocks = expert_blocks(kind, 5, 512, seed=1)
    weight = expert_weight(blocks, gguf.GGMLQuantizationType[kind])
    assert weight.shape == (5, 512)
    assert torch.equal(dequantize(weight), gguf_values(kind, blocks))


def test_mxfp4_scales_at_every_exponent_equal_ggufs():
    """e8m0 exponents 0 and 1 give subnormal scales, 255 the largest."""
    blocks = expert_blocks("MXFP4", 8, 32 * 32, seed=2)
    blocks.reshape(8, 32, 17)[..., 0] = np.arange(256, dtype=np.uint8).reshape(8, 32)
    blocks.reshape(8, 32, 17)[..., 1:] &= 0x99  # levels 0 and +-1: 2^127 stays finite
    assert torch.equal(dequantize(expert_weight(blocks, "MXFP4")), gguf_values("MXFP4", blocks))


def test_expert_weight_shares_the_files_mapping(tmp_path):
    path = tmp_path / "experts.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    blocks = expert_blocks("Q4_K", 4 * 6, 256).reshape(4, 6, 144)
    writer.add_tensor("blk.0.ffn_gate_exps.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    tensor = reader.tensors[0]
    start = reader.data.ctypes.data
    weight = expert_weight(tensor.data[2], tensor.tensor_type)
    pointer = weight.blocks.data_ptr()
    assert start <= pointer and pointer + weight.nbytes <= start + reader.data.nbytes
    assert torch.equal(dequantize(weight), gguf_values("Q4_K", blocks[2]))


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ModelLoadError, match="whole 144-byte blocks"):
        expert_weight(np.zeros((3, 100), dtype=np.uint8), "Q4_K")
    with pytest.raises(ModelLoadError, match="not read in place"):
        expert_weight(np.zeros((3, 22), dtype=np.uint8), "Q5_0")
    assert "Q5_0" not in IN_PLACE_EXPERT_TYPES


def test_selected_rows_stay_in_place_blocks():
    blocks = expert_blocks("Q8_0", 6, 64)
    picked = select_rows(expert_weight(blocks, "Q8_0"), torch.tensor([4, 1]))
    assert isinstance(picked, GGUFRows)
    assert torch.equal(dequantize(picked), gguf_values("Q8_0", blocks)[[4, 1]])
