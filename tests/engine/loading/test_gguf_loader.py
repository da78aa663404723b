"""GGUF files load as they are: quantized blocks in the engine's layouts, config and tokenizer
from the file's metadata (cached), q/k rows back in Hugging Face's order, clear errors."""

import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as QType
from tiny_gguf import (
    CHAT_TEMPLATE,
    HEADS,
    KV_HEADS,
    random_blocks,
    tensor_names,
    write_tiny_gguf,
)

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf import (
    GGUFModelFile,
    decode_int4,
    gguf_tensor_name,
    open_gguf_reader,
    rotary_unpermutation,
)
from pagoda.engine.loading.gguf_blocks import EXACT_TYPES
from pagoda.engine.loading.layouts import GGUF_BLOCK_BYTES_PER_ELEMENT, GGUF_WIDENED_TYPES
from pagoda.engine.loading.loader import (
    cache_dir,
    load_model,
    metadata_cache_folder,
    tokenizer_folder,
)
from pagoda.engine.models.registry import expected_weight_shapes
from pagoda.engine.quantization.tensors import BlockWeight, Int4Weight, Int8Weight, dequantize

INT4_TYPES = (QType.Q4_0, QType.Q4_1, QType.Q4_K)
WIDENED_TYPES = tuple(sorted(QType[name] for name in GGUF_WIDENED_TYPES))
INT8_TYPES = (QType.Q6_K, QType.Q8_0, *WIDENED_TYPES)
FLOAT_TYPES = (QType.F32, QType.F16, QType.BF16)
Q_PROJ = "model.layers.1.self_attn.q_proj.weight"
# The default model's tokenizer cache is shared with every other run (keyed by content).
USER_CACHE = cache_dir()
K_PROJ = "model.layers.1.self_attn.k_proj.weight"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(tmp_path / "cache"))


def load(path: Path, quantization: str = "auto"):
    model = GGUFModelFile(path)
    config, tokenizer = model.config_and_tokenizer(metadata_cache_folder(path))
    return config, tokenizer, model.weights(expected_weight_shapes(config), config, quantization)


def reference(path: Path, hf_name: str) -> torch.Tensor:
    """gguf-py's own dequantization of a tensor, rows in the order the file stores them."""
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == gguf_tensor_name(hf_name))
    return torch.from_numpy(np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type)))


def rows_in_file_order(weight: torch.Tensor, heads: int) -> torch.Tensor:
    return weight[torch.argsort(rotary_unpermutation(weight.shape[0], heads))]


def random_rows(kind: QType, rows: int = 64, cols: int = 512, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == QType.Q4_K:
        return random_blocks(kind, rows, cols, rng)
    return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), kind)


# Block decoding


@pytest.mark.parametrize("kind", INT4_TYPES, ids=lambda k: k.name)
def test_4_bit_blocks_decode_to_exactly_ggufs_values(kind):
    raw = random_rows(kind)
    weight = decode_int4(raw, kind)
    assert isinstance(weight, Int4Weight) and weight.shape == (64, 512)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, kind))
    assert torch.equal(dequantize(weight), expected)


def test_q4_k_decodes_every_6_bit_scale_and_min():
    # Scale and min bytes with every bit set reach the top sub-block values (63), which live
    # split across three bytes.
    raw = random_rows(QType.Q4_K).reshape(64, 2, 144)
    raw[0, 0, 4:16] = 0xFF
    raw = raw.reshape(64, -1)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, QType.Q4_K))
    assert torch.equal(dequantize(decode_int4(raw, QType.Q4_K)), expected)


@pytest.mark.parametrize("kind", INT4_TYPES + INT8_TYPES + FLOAT_TYPES, ids=lambda k: k.name)
def test_each_supported_type_loads_in_its_layout_and_matches_ggufs_dequantization(tmp_path, kind):
    path = write_tiny_gguf(tmp_path / f"tiny.{kind.name}.gguf", matrix_type=kind).path
    _, _, weights = load(path)
    _, _, floats = load(path, "none")
    name = "model.layers.0.mlp.down_proj.weight"
    expected = reference(path, name)
    assert torch.equal(floats[name], expected)
    if kind in INT4_TYPES:
        assert isinstance(weights[name], Int4Weight)
        assert torch.equal(dequantize(weights[name]), expected)
    elif kind == QType.Q8_0:
        assert isinstance(weights[name], Int8Weight) and weights[name].group_size == 32
        assert torch.equal(dequantize(weights[name]), expected)
    elif kind.name in GGUF_BLOCK_BYTES_PER_ELEMENT:  # the file's own blocks, read in place
        assert isinstance(weights[name], BlockWeight) and weights[name].TYPE_NAME == kind.name
        assert torch.equal(dequantize(weights[name]), expected)
    elif kind in EXACT_TYPES:  # small integers times a factor per 32: int8 holds them as they are
        assert isinstance(weights[name], Int8Weight) and weights[name].group_size == 32
        # A min is added by a fused multiply-add, which rounds once where ggml rounds twice.
        torch.testing.assert_close(dequantize(weights[name]), expected, rtol=1e-6, atol=1e-6)
    elif kind in INT8_TYPES:
        weight = weights[name]
        assert isinstance(weight, Int8Weight) and weight.group_size == 32
        half_step = weight.scales.abs().repeat_interleave(weight.group_size, dim=1) / 2
        assert ((dequantize(weight) - expected).abs() <= half_step * 1.001).all()
    else:
        assert isinstance(weights[name], torch.Tensor)
        assert torch.equal(weights[name], expected)
    assert weights["model.norm.weight"].dtype == torch.float32


# Names, shapes and the q/k row order


def test_llama_q_and_k_rows_come_back_in_hugging_face_order(tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.F32)
    _, _, weights = load(model.path)
    for name in (Q_PROJ, K_PROJ):
        assert torch.equal(weights[name], torch.from_numpy(model.source[name]))


@pytest.mark.parametrize("kind", [QType.Q4_K, QType.Q8_0], ids=lambda k: k.name)
def test_quantized_q_and_k_are_reordered_exactly(tmp_path, kind):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=kind).path
    _, _, weights = load(path)
    _, _, floats = load(path, "none")
    for name, heads in ((Q_PROJ, HEADS), (K_PROJ, KV_HEADS)):
        assert torch.equal(rows_in_file_order(floats[name], heads), reference(path, name))
        if kind == QType.Q4_K:
            assert torch.equal(dequantize(weights[name]), floats[name])


def test_dequantized_weights_match_transformers_own_gguf_loading(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.Q4_0.gguf", matrix_type=QType.Q4_0).path
    _, _, weights = load(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name,
                                                           dtype=torch.float32)
    theirs = dict(hf.named_parameters())  # the tied lm_head once, as the embedding
    assert set(theirs) == set(weights)
    for name, value in theirs.items():
        assert torch.equal(dequantize(weights[name]), value), name


def test_qwen2_loads_its_biases_in_file_order(tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2", QType.F32)
    config, _, weights = load(model.path)
    assert config.model_type == "qwen2"
    for name in (Q_PROJ, Q_PROJ.replace("weight", "bias"), K_PROJ.replace("weight", "bias")):
        assert torch.equal(weights[name], torch.from_numpy(model.source[name]))


def test_qwen3_loads_q_and_k_norms_and_the_files_head_dim(tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen3", QType.Q8_0)
    config, _, weights = load(model.path)
    assert config.model_type == "qwen3" and config.head_dim == 64
    name = "model.layers.1.self_attn.k_norm.weight"
    assert torch.equal(weights[name], torch.from_numpy(model.source[name]))


def test_a_separate_output_matrix_becomes_lm_head(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q4_1, tied=False).path
    config, _, weights = load(path)
    assert not config.tie_word_embeddings
    assert isinstance(weights["lm_head.weight"], Int4Weight)


# Through load_model


def test_gguf_loads_directly_with_its_name_and_path(tmp_path):
    path = write_tiny_gguf(tmp_path / "Tiny-Model.Q4_0.gguf", matrix_type=QType.Q4_0).path
    model = load_model(path)
    assert model.name == "Tiny-Model" and model.path == path
    assert set(model.weights) == set(expected_weight_shapes(model.config))
    assert isinstance(model.weights[Q_PROJ], Int4Weight)
    assert not (cache_dir() / "models").exists()


def test_none_dequantizes_every_weight_to_the_requested_dtype(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q4_K).path
    model = load_model(path, dtype=torch.bfloat16, quantization="none")
    assert all(isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16
               for w in model.weights.values())


@pytest.mark.parametrize("quantization, layout", [("int8", Int8Weight), ("int4", Int4Weight)])
def test_int8_and_int4_requantize_the_layers_of_another_type(tmp_path, quantization, layout):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q5_0).path
    model = load_model(path, quantization=quantization)
    assert isinstance(model.weights[Q_PROJ], layout)


def test_load_reports_its_steps(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q4_0).path
    steps = []
    load_model(path, on_progress=lambda step, done, total: steps.append((step, done, total)))
    assert [done for _, done, _ in steps] == [0, 1, 2, 3]
    assert {total for _, _, total in steps} == {3}


def test_chat_template_and_special_tokens_come_from_the_file(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf").path
    tokenizer = load_model(path).tokenizer
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token_id == 2
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]


def test_old_conversion_folders_are_removed(tmp_path):
    old = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1-4943cdb52790"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"\0" * 1024)
    load_model(write_tiny_gguf(tmp_path / "tiny.gguf").path)
    assert not (cache_dir() / "models").exists()


# The config and tokenizer cache


def test_second_load_takes_config_and_tokenizer_from_the_cache(tmp_path, monkeypatch):
    path = write_tiny_gguf(tmp_path / "tiny.gguf").path
    first = load_model(path)

    def build_again(self):
        raise AssertionError("the tokenizer was built from the GGUF file a second time")

    monkeypatch.setattr(GGUFModelFile, "_build_config_and_tokenizer", build_again)
    again = load_model(path)
    assert again.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    assert again.config.to_diff_dict().keys() >= {"hidden_size", "num_hidden_layers"}
    assert (again.config.hidden_size, again.config.head_dim) == (256, 64)


def test_a_corrupt_cache_is_rebuilt(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf").path
    load_model(path)
    cache = metadata_cache_folder(path)
    (cache / "tokenizer.json").write_text('{"version": "1.0", "trunc')
    assert load_model(path).tokenizer.eos_token_id == 2
    assert transformers.AutoTokenizer.from_pretrained(cache).eos_token_id == 2


def test_a_half_written_cache_is_ignored(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf").path
    cache = metadata_cache_folder(path)
    cache.mkdir(parents=True)
    (cache / "config.json").write_text("{")
    assert load_model(path).config.hidden_size == 256
    assert not list(cache.parent.glob(".*partial*"))


def test_an_unwritable_cache_does_not_stop_loading(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(blocker))
    assert load_model(write_tiny_gguf(tmp_path / "tiny.gguf").path).config.hidden_size == 256


def test_tokenizer_folder_gives_a_gguf_files_tokenizer(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf").path
    folder = tokenizer_folder(path)
    assert transformers.AutoTokenizer.from_pretrained(folder).chat_template == CHAT_TEMPLATE


def test_metadata_reads_as_gguf_pys_own_reader_reads_it(tmp_path):
    """Our reader splits arrays in bulk (a 262k-token vocabulary took gguf-py 16-20 s): every
    field, part for part, is what gguf-py itself gives, arrays of each kind included."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf").path
    writer = gguf.GGUFWriter(tmp_path / "arrays.gguf", "llama")
    writer.add_array("test.strings", ["", "a", "Ġt", "首都", "x" * 300])
    writer.add_array("test.floats", [0.5, -1.25, 3.0])
    writer.add_array("test.ints", [7, -8, 2**31 - 1])
    writer.add_array("test.bools", [True, False, True])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_array("test.empty", [])
    writer.add_uint32("test.scalar", 9)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    for file in (path, tmp_path / "arrays.gguf"):
        ours, theirs = open_gguf_reader(file), gguf.GGUFReader(file)
        assert list(ours.fields) == list(theirs.fields)
        for name, want in theirs.fields.items():
            got = ours.fields[name]
            assert (got.offset, got.data, got.types) == (want.offset, want.data, want.types), name
            assert len(got.parts) == len(want.parts), name
            for a, b in zip(got.parts, want.parts, strict=True):
                assert a.dtype == b.dtype and np.array_equal(a, b), name
            assert got.contents() == want.contents(), name
        assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    assert open_gguf_reader(tmp_path / "arrays.gguf").fields["test.strings"].contents()[3] == "首都"


# What users get wrong


def test_truncated_gguf_names_the_file(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q4_0).path
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ModelLoadError, match="not a complete GGUF file") as error:
        load_model(path)
    assert str(path) in str(error.value)


def test_empty_file_is_not_a_gguf(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty.gguf"):
        load_model(path)


@pytest.mark.parametrize("kind", [QType.TQ1_0, QType.TQ2_0], ids=lambda k: k.name)
def test_unsupported_tensor_type_names_the_tensor_the_type_and_what_to_download(tmp_path, kind):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=kind).path
    with pytest.raises(ModelLoadError, match=kind.name) as error:
        load_model(path)
    assert "token_embd.weight" in str(error.value) and str(path) in str(error.value)
    assert "download a Q4_K_M" in str(error.value)


def test_missing_tensor_names_it(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", skip=("blk.1.ffn_up.weight",)).path
    with pytest.raises(ModelLoadError, match=r"blk\.1\.ffn_up\.weight") as error:
        load_model(path)
    assert "model.layers.1.mlp.up_proj.weight" in str(error.value)


@pytest.mark.parametrize("damage, words", [
    ({"skip": tensor_names()}, "holds no tensors: it has a model's settings but none of its"),
    ({"skip": ("blk.0.attn_k.weight",)}, r"no tensor blk\.0\.attn_k\.weight"),
    ({"matrix_type": QType.TQ2_0}, "stored as TQ2_0, which Pagoda cannot read"),
], ids=["no weights", "a matrix missing", "unreadable matrices"])
def test_a_file_that_cannot_run_is_refused_before_its_tokenizer_is_read(tmp_path, monkeypatch,
                                                                        damage, words):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", **damage).path

    def read_tokenizer(self):
        raise AssertionError("the tokenizer was read before the file's tensors were checked")

    monkeypatch.setattr(GGUFModelFile, "_build_config_and_tokenizer", read_tokenizer)
    steps = []
    with pytest.raises(ModelLoadError, match=words) as error:
        load_model(path, on_progress=lambda step, _done, _total: steps.append(step))
    assert str(path) in str(error.value) and "download" in str(error.value)
    assert steps == ["reading the model file"]


def test_unsupported_architecture_names_it_and_the_file(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", architecture="gpt2").path
    with pytest.raises(ModelLoadError, match="'gpt2'") as error:
        load_model(path)
    assert str(path) in str(error.value) and "Llama 2/3" in str(error.value)


# The default model


def test_default_model_keeps_int4_layers_and_an_int8_embedding(monkeypatch):
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(USER_CACHE))
    start = time.perf_counter()
    model = load_model()
    print(f"default model, auto: {time.perf_counter() - start:.2f} s")
    assert model.name == "SmolLM2-135M-Instruct"
    weights = model.weights
    assert isinstance(weights["model.embed_tokens.weight"], Int8Weight)
    assert weights["model.embed_tokens.weight"].shape == (49152, 576)
    layer_matrices = [w for name, w in weights.items() if name.startswith("model.layers.")
                      and name.endswith("proj.weight")]
    assert len(layer_matrices) == 210 and all(isinstance(w, Int4Weight) for w in layer_matrices)
    assert weights["model.norm.weight"].dtype == torch.float32
    # Q4_1 maps exactly onto the int4 layout: the same values as gguf-py's dequantization.
    tensors = GGUFModelFile(model.path).tensors
    for name, heads in ((Q_PROJ, 9), ("model.layers.29.mlp.down_proj.weight", None)):
        tensor = tensors[gguf_tensor_name(name)]
        expected = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type))
        ours = dequantize(weights[name])
        assert torch.equal(rows_in_file_order(ours, heads) if heads else ours, expected)
