"""describe_model reads a model's headers only: its format, quantization, size and memory need."""

import json
import sys

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.model_info import (
    GIB,
    INT4_BYTES_PER_ELEMENT,
    INT8_BYTES_PER_ELEMENT,
    MEMORY_OVERHEAD_BYTES,
    VOCABULARY_EXACT_BYTES,
    available_memory,
    check_fits_memory,
    describe_model,
    memory_needed,
)

Q = gguf.GGMLQuantizationType
VOCAB, HIDDEN, INTER = 64, 32, 96
EMBEDDING = VOCAB * HIDDEN
MATRICES = 2 * HIDDEN * INTER  # two Q4_0 matrices: [INTER, HIDDEN] and [HIDDEN, INTER]
NORM = HIDDEN

VOCABULARY_INT8 = INT8_BYTES_PER_ELEMENT + VOCABULARY_EXACT_BYTES["int8"]


def _add(writer: gguf.GGUFWriter, name: str, out_features: int, in_features: int,
         qtype: Q) -> None:
    values = np.random.default_rng(0).standard_normal((out_features, in_features), np.float32)
    writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)


@pytest.fixture
def tiny_gguf(tmp_path):
    """A Q8_0 embedding, two Q4_0 matrices and an F32 norm."""
    path = tmp_path / "Tiny-Model.Q4_0.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    _add(writer, "token_embd.weight", VOCAB, HIDDEN, Q.Q8_0)
    _add(writer, "blk.0.ffn_up.weight", INTER, HIDDEN, Q.Q4_0)
    _add(writer, "blk.0.ffn_down.weight", HIDDEN, INTER, Q.Q4_0)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(NORM, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def tiny_folder(tmp_path):
    """A bf16 Hugging Face folder with an untied lm_head."""
    folder = tmp_path / "tiny-hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({
        "model.embed_tokens.weight": torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.zeros(INTER, HIDDEN, dtype=torch.bfloat16),
        "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16),
    }, folder / "model.safetensors")
    return folder


def test_a_gguf_is_described_by_its_most_common_matrix_type(tiny_gguf):
    info = describe_model(tiny_gguf)
    assert (info.name, info.format, info.quantization) == ("Tiny-Model", "gguf", "Q4_0")
    assert info.file_quantization == "Q4_0"
    assert info.num_parameters == EMBEDDING + MATRICES + NORM


def test_gguf_blocks_keep_their_layout_under_auto(tiny_gguf):
    expected = (MATRICES * INT4_BYTES_PER_ELEMENT + EMBEDDING * VOCABULARY_INT8
                + NORM * 4)
    assert describe_model(tiny_gguf, "auto").weight_bytes == round(expected)


def test_none_keeps_every_weight_at_the_compute_dtype(tiny_gguf):
    info = describe_model(tiny_gguf, "none")
    assert info.quantization == "fp32" and info.file_quantization == "Q4_0"
    assert info.weight_bytes == 4 * (EMBEDDING + MATRICES + NORM)
    assert describe_model(tiny_gguf, "none", torch.bfloat16).weight_bytes == \
        2 * (EMBEDDING + MATRICES + NORM)


def test_int8_quantizes_every_matrix(tiny_gguf):
    info = describe_model(tiny_gguf, "int8")
    assert info.quantization == "int8"
    assert info.weight_bytes == round(EMBEDDING * VOCABULARY_INT8 + MATRICES * INT8_BYTES_PER_ELEMENT + NORM * 4)


def test_int4_keeps_the_embedding_at_int8(tiny_gguf):
    info = describe_model(tiny_gguf, "int4")
    assert info.quantization == "int4"
    assert info.weight_bytes == round(MATRICES * INT4_BYTES_PER_ELEMENT
                                      + EMBEDDING * VOCABULARY_INT8 + NORM * 4)


def test_a_safetensors_folder_is_read_from_its_headers(tiny_folder):
    info = describe_model(tiny_folder)
    assert (info.name, info.format, info.quantization) == ("tiny-hf", "safetensors", "bf16")
    assert info.num_parameters == 2 * EMBEDDING + INTER * HIDDEN + HIDDEN
    # A folder loads as it is: every weight at the compute dtype, fp32 on CPU.
    assert info.weight_bytes == 4 * info.num_parameters


def test_a_safetensors_folder_under_int4(tiny_folder):
    info = describe_model(tiny_folder, "int4")
    assert info.weight_bytes == round(2 * EMBEDDING * VOCABULARY_INT8
                                      + INTER * HIDDEN * INT4_BYTES_PER_ELEMENT + HIDDEN * 4)


def test_the_default_model_is_a_135m_q4_1_gguf():
    info = describe_model(None)
    assert (info.name, info.format, info.quantization) == ("SmolLM2-135M-Instruct", "gguf", "Q4_1")
    assert 130e6 < info.num_parameters < 140e6
    assert 100e6 < info.weight_bytes < 200e6  # int4 layers, int8 embedding; fp32 would be 538 MB


def test_a_model_that_does_not_fit_is_refused_with_what_to_do(tiny_gguf):
    info = describe_model(tiny_gguf)
    kv = 2 * GIB
    with pytest.raises(ModelLoadError) as error:
        check_fits_memory(info, kv, available=GIB)
    message = str(error.value)
    assert "Tiny-Model" in message
    assert "2.5 GiB" in message and "1.0 GiB is available" in message
    assert "int4" in message and "smaller" in message


def test_a_model_fits_in_exactly_what_it_needs_and_not_a_byte_less(tiny_gguf):
    info = describe_model(tiny_gguf)
    needed = GIB + MEMORY_OVERHEAD_BYTES + info.weight_bytes
    assert memory_needed(info, GIB) == needed
    check_fits_memory(info, GIB, available=needed)
    with pytest.raises(ModelLoadError, match="needs about"):
        check_fits_memory(info, GIB, available=needed - 1)


def test_a_missing_model_names_the_path(tmp_path):
    with pytest.raises(ModelLoadError, match="no-such.gguf does not exist"):
        describe_model(tmp_path / "no-such.gguf")


def test_an_unsupported_file_names_the_file(tmp_path):
    weights = tmp_path / "pytorch_model.bin"
    weights.write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match="pytorch_model.bin is neither"):
        describe_model(weights)


def test_a_truncated_gguf_names_the_file(tmp_path, tiny_gguf):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="cut.gguf is not a complete GGUF file"):
        describe_model(cut)


def test_a_folder_without_config_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        describe_model(tmp_path)


def test_an_unknown_quantization_is_refused(tiny_gguf):
    with pytest.raises(ValueError, match="int3"):
        describe_model(tiny_gguf, "int3")


def test_an_engine_refuses_a_model_too_large_before_loading_it(monkeypatch, tiny_gguf):
    from pagoda.engine import EngineConfig, LLMEngine
    from pagoda.engine.loading import model_info

    loads = []
    monkeypatch.setattr(model_info, "available_memory", lambda: 64 << 20)
    monkeypatch.setattr("pagoda.engine.llm_engine.load_model", lambda *args, **kw: loads.append(args))
    with pytest.raises(ModelLoadError, match="needs about"):
        LLMEngine(str(tiny_gguf), EngineConfig(num_kv_blocks=8))
    assert loads == []
