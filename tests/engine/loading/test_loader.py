import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tiny_models import save_tiny_model

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.loading import loader
from pagoda.engine.loading.loader import (
    default_model_file,
    load_model,
    metadata_cache_folder,
)
from pagoda.engine.models.config import layer_windows
from pagoda.engine.models.registry import expected_weight_shapes


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory, default_model) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("qwen2"), "qwen2", default_model.path)


@pytest.fixture(scope="session")
def tiny_mistral(tmp_path_factory, default_model) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("mistral"), "mistral", default_model.path)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory, default_model) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("llama"), "llama", default_model.path)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory, default_model) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("qwen3"), "qwen3", default_model.path)


@pytest.fixture
def model_copy(tmp_path, tiny_qwen2) -> Path:
    """A tiny model this test may damage."""
    return Path(shutil.copytree(tiny_qwen2, tmp_path / "model"))


def rope_theta(config) -> float:
    """The RoPE base the model's rotary table is built with."""
    return rope_spec(config, 64).theta


def edit_weights(folder: Path, edit) -> None:
    file = folder / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


# The default model


def test_default_model_is_smollm2_135m(default_model):
    config = default_model.config
    assert default_model.name == "SmolLM2-135M-Instruct"
    assert config.model_type == "llama"
    assert config.num_hidden_layers == 30
    assert config.hidden_size == 576
    assert config.num_attention_heads == 9
    assert config.num_key_value_heads == 3
    assert config.vocab_size == 49152
    assert config.tie_word_embeddings
    assert rope_theta(config) == 100000.0


def test_default_model_has_a_chatml_template(default_model):
    tokenizer = default_model.tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nHi<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token_id == 2


def test_default_model_weights_are_float32_and_tied(default_model):
    assert set(default_model.weights) == set(expected_weight_shapes(default_model.config))
    assert "lm_head.weight" not in default_model.weights
    assert all(w.dtype == torch.float32 for w in default_model.weights.values())
    assert default_model.weights["model.embed_tokens.weight"].shape == (49152, 576)


def test_default_model_loads_from_its_gguf_file(default_model):
    assert default_model.path == default_model_file()


def test_broken_gguf_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "broken.Q4_0.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="broken.Q4_0.gguf"):
        load_model(gguf)


# Hugging Face folders


def test_qwen2_folder_loads_with_qkv_bias_and_its_own_lm_head(tiny_qwen2):
    model = load_model(tiny_qwen2)
    assert model.name == tiny_qwen2.name
    assert model.path == tiny_qwen2
    for proj in ("q_proj", "k_proj", "v_proj"):
        assert f"model.layers.1.self_attn.{proj}.bias" in model.weights
    assert "model.layers.1.self_attn.o_proj.bias" not in model.weights
    assert model.weights["model.layers.0.self_attn.q_proj.bias"].shape == (64,)
    assert model.weights["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    assert model.weights["lm_head.weight"].shape == (49152, 64)
    assert rope_theta(model.config) == 1000000.0


def test_mistral_folder_loads_without_biases(tiny_mistral, default_model):
    model = load_model(tiny_mistral)
    assert model.config.model_type == "mistral"
    assert not [name for name in model.weights if name.endswith(".bias")]
    assert "lm_head.weight" in model.weights
    assert model.tokenizer.chat_template == default_model.tokenizer.chat_template


def test_tied_llama_folder_has_no_lm_head(tiny_llama):
    model = load_model(tiny_llama)
    assert model.config.tie_word_embeddings
    assert "lm_head.weight" not in model.weights
    assert set(model.weights) == set(expected_weight_shapes(model.config))


def test_qwen3_folder_loads_per_head_q_and_k_norms(tiny_qwen3):
    model = load_model(tiny_qwen3)
    # head_dim 32 is explicit in config.json: 4 heads of 32 from a hidden size of 64.
    assert model.weights["model.layers.1.self_attn.q_norm.weight"].shape == (32,)
    assert model.weights["model.layers.1.self_attn.k_norm.weight"].shape == (32,)
    assert model.weights["model.layers.0.self_attn.q_proj.weight"].shape == (128, 64)
    assert model.weights["model.layers.0.self_attn.o_proj.weight"].shape == (64, 128)
    assert not [name for name in model.weights if name.endswith(".bias")]


def test_qwen3_without_k_norm_names_the_tensor(tmp_path, tiny_qwen3):
    folder = Path(shutil.copytree(tiny_qwen3, tmp_path / "model"))
    edit_weights(folder, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
        load_model(folder)


def test_qwen3_q_norm_over_the_wrong_head_dim_is_reported(tmp_path, tiny_qwen3):
    folder = Path(shutil.copytree(tiny_qwen3, tmp_path / "model"))
    # 16 = hidden / heads: what a loader that ignored the explicit head_dim would expect.
    edit_weights(folder, lambda t: t.update({"model.layers.0.self_attn.q_norm.weight":
                                             torch.ones(16)}))
    with pytest.raises(ModelLoadError, match=r"self_attn\.q_norm\.weight") as error:
        load_model(folder)
    assert "(16,)" in str(error.value) and "(32,)" in str(error.value)


def test_weights_are_cast_to_the_requested_dtype(tiny_mistral):
    model = load_model(tiny_mistral, dtype=torch.bfloat16)
    assert all(w.dtype == torch.bfloat16 for w in model.weights.values())


def test_config_that_is_not_a_json_object_is_a_load_error(model_copy):
    (model_copy / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(ModelLoadError, match="config.json holds a JSON list"):
        load_model(model_copy)


def test_sharded_folder_loads(model_copy):
    tensors = load_file(model_copy / "model.safetensors")
    (model_copy / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, shard_names in shards.items():
        save_file(
            {n: tensors[n] for n in shard_names}, model_copy / file, metadata={"format": "pt"}
        )
    weight_map = {n: file for file, shard_names in shards.items() for n in shard_names}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model = load_model(model_copy)
    assert set(model.weights) == set(expected_weight_shapes(model.config))


def test_extra_tensors_are_ignored(model_copy):
    edit_weights(
        model_copy,
        lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}),
    )
    assert "model.layers.0.self_attn.rotary_emb.inv_freq" not in load_model(model_copy).weights


# What users get wrong


def test_missing_path_is_reported(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist") as error:
        load_model(tmp_path / "nowhere")
    assert "nowhere" in str(error.value)


def test_folder_without_config_is_not_a_model_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="not a model folder") as error:
        load_model(tmp_path)
    assert str(tmp_path) in str(error.value)


def test_file_that_is_not_gguf_is_rejected(tmp_path):
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match="model.bin"):
        load_model(weights)


def test_unsupported_architecture_names_model_type_and_supported_ones(model_copy):
    config_file = model_copy / "config.json"
    config = json.loads(config_file.read_text())
    config["model_type"] = "gpt2"
    config_file.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="gpt2") as error:
        load_model(model_copy)
    assert "Llama (Llama 2/3, SmolLM/SmolLM2, Mistral, Qwen2/2.5, Qwen3)" in str(error.value)


def test_a_family_not_run_yet_is_refused_with_the_reason(model_copy):
    config_file = model_copy / "config.json"
    config = json.loads(config_file.read_text())
    config["model_type"] = "deepseek_v3"
    config_file.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="mixture-of-experts: not yet"):
        load_model(model_copy)


def test_folder_without_weight_files_is_reported(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no weight files \(\*\.safetensors\)"):
        load_model(model_copy)


def test_truncated_safetensors_names_the_file(model_copy):
    file = model_copy / "model.safetensors"
    with file.open("r+b") as handle:
        handle.truncate(file.stat().st_size // 2)
    with pytest.raises(ModelLoadError, match="truncated or corrupt") as error:
        load_model(model_copy)
    assert str(file) in str(error.value)


def test_missing_shard_names_the_shard(model_copy):
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors"):
        load_model(model_copy)


def test_missing_tensor_names_the_tensor(model_copy):
    edit_weights(model_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(model_copy)


def test_misshaped_tensor_names_expected_and_actual_shape(model_copy):
    edit_weights(model_copy, lambda t: t.update({"model.norm.weight": torch.ones(63)}))
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight") as error:
        load_model(model_copy)
    assert "(63,)" in str(error.value) and "(64,)" in str(error.value)


def test_missing_tokenizer_is_reported(model_copy):
    (model_copy / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer"):
        load_model(model_copy)


def test_corrupt_tokenizer_is_reported(model_copy):
    (model_copy / "tokenizer.json").write_text("not json")
    with pytest.raises(ModelLoadError, match="tokenizer") as error:
        load_model(model_copy)
    assert str(model_copy) in str(error.value)


# Config helpers


def test_rope_theta_reads_old_and_new_config_layouts():
    assert rope_theta(SimpleNamespace(rope_theta=500000.0)) == 500000.0
    new_layout = SimpleNamespace(rope_theta=None, rope_parameters={"rope_theta": 1e6})
    assert rope_theta(new_layout) == 1e6
    assert rope_theta(SimpleNamespace(rope_parameters={"rope_theta": 1e6})) == 1e6
    assert rope_theta(SimpleNamespace()) == 10000.0


def qwen3_window_config(use_sliding_window: bool, max_window_layers: int):
    return transformers.Qwen3Config(num_hidden_layers=2, sliding_window=24,
                                    use_sliding_window=use_sliding_window,
                                    max_window_layers=max_window_layers)


def test_qwen_sliding_window_follows_its_layer_types():
    # Hugging Face windows the layers from max_window_layers on, and only with use_sliding_window.
    assert layer_windows(qwen3_window_config(False, 0)) == (0, 0)
    assert layer_windows(qwen3_window_config(True, 2)) == (0, 0)
    assert layer_windows(qwen3_window_config(True, 0)) == (24, 24)


def test_window_in_some_layers_only_windows_those_layers():
    assert layer_windows(qwen3_window_config(True, 1)) == (0, 24)


def test_expected_shapes_use_an_explicit_head_dim():
    config = transformers.MistralConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=128,
        vocab_size=100,
        num_hidden_layers=1,
        tie_word_embeddings=False,
    )
    shapes = expected_weight_shapes(config)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (128, 64)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (64, 64)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (64, 128)
    assert shapes["lm_head.weight"] == (100, 64)


def test_a_copy_of_the_same_gguf_reuses_its_tokenizer_cache(tmp_path):
    copy = tmp_path / "elsewhere" / default_model_file().name
    copy.parent.mkdir()
    shutil.copyfile(default_model_file(), copy)
    assert metadata_cache_folder(copy) == metadata_cache_folder(default_model_file())


def test_a_changed_gguf_gets_its_own_tokenizer_cache(tmp_path):
    original = tmp_path / "a.gguf"
    original.write_bytes(bytes(range(256)) * 16384)  # 4 MiB: past the 1 MiB header read
    changed = tmp_path / "b" / "a.gguf"
    changed.parent.mkdir()
    data = bytearray(original.read_bytes())
    data[len(data) // 2] ^= 0xFF
    changed.write_bytes(bytes(data))
    assert metadata_cache_folder(original) != metadata_cache_folder(changed)


def test_a_new_way_of_building_configs_from_files_reads_no_older_cache(monkeypatch):
    before = metadata_cache_folder(default_model_file())
    monkeypatch.setattr(loader, "METADATA_FORMAT", loader.METADATA_FORMAT + 1)
    assert metadata_cache_folder(default_model_file()) != before
