"""A model Pagoda does not run is refused from its GGUF header or config.json alone, with the
reason, before the engine is imported or any tokenizer or weight is read."""

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest
from tiny_gguf import QType, write_tiny_gguf

from pagoda.engine.errors import MalformedGGUFError, ModelLoadError
from pagoda.engine.loading.gguf import open_gguf_reader
from pagoda.engine.loading.model_check import refuse_unrunnable_model
from pagoda.engine.loading.model_info import read_model_headers


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("check")
    return {
        "deepseek2": write_tiny_gguf(folder / "moe.gguf", architecture="deepseek2").path,
        "qwen3vl": write_tiny_gguf(folder / "vl.gguf", architecture="qwen3vl").path,
        "bert": write_tiny_gguf(folder / "bert.gguf", architecture="bert").path,
        "TQ2_0": write_tiny_gguf(folder / "tq.gguf", matrix_type=QType.TQ2_0).path,
        "llama": write_tiny_gguf(folder / "llama.gguf").path,
    }


@pytest.mark.parametrize(("file", "reason"), [
    ("deepseek2", "Unsupported architecture 'deepseek2'"),
    ("deepseek2", "mixture-of-experts: not yet"),
    ("qwen3vl", "vision-language model: not yet"),
    ("bert", "not a model family Pagoda knows"),
    ("TQ2_0", "is stored as TQ2_0, which Pagoda cannot read"),
])
def test_a_gguf_of_a_family_or_type_pagoda_does_not_run_is_refused_with_the_reason(
        ggufs, file, reason):
    with pytest.raises(ModelLoadError, match=reason) as refused:
        refuse_unrunnable_model(ggufs[file])

    assert str(ggufs[file]) in str(refused.value)


def test_the_refusal_names_the_families_pagoda_runs(ggufs):
    with pytest.raises(ModelLoadError, match="Pagoda runs these families: Llama"):
        refuse_unrunnable_model(ggufs["deepseek2"])


def test_a_gguf_pagoda_runs_passes(ggufs):
    refuse_unrunnable_model(ggufs["llama"])


@pytest.mark.parametrize(("config", "reason"), [
    ({"model_type": "deepseek_v3"}, "mixture-of-experts: not yet"),
    ({"model_type": "gemma4_text", "enable_moe_block": True},
     "Gemma 4's mixture-of-experts model .*: mixture-of-experts: not yet"),
    ({"model_type": "jamba"}, "hybrid attention and state-space layers: not yet"),
    ({"model_type": "qwen3_vl"}, "vision-language model: not yet"),
    ({"model_type": ["llama"]}, "not a model family Pagoda knows"),
    ({"model_type": "llama", "quantization_config": {"quant_method": "gptq"}},
     "quantized checkpoint \\(gptq\\)"),
    ([1, 2], "holds a JSON list"),
])
def test_a_folder_whose_config_pagoda_does_not_run_is_refused_with_the_reason(
        tmp_path, config, reason):
    (tmp_path / "config.json").write_text(json.dumps(config))

    with pytest.raises(ModelLoadError, match=reason):
        refuse_unrunnable_model(tmp_path)


def test_a_gemma4_gguf_with_expert_routers_is_refused_but_a_dense_one_passes(tmp_path):
    """Gemma 4's 26B-A4B is a "gemma4" file like the dense models the family runs."""
    def gemma4_file(name: str, tensors: list[str]):
        writer = gguf.GGUFWriter(tmp_path / name, "gemma4")
        for tensor in tensors:
            writer.add_tensor(tensor, np.zeros((4, 4), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return tmp_path / name

    dense = ["token_embd.weight", "blk.0.attn_q.weight"]
    refuse_unrunnable_model(gemma4_file("dense.gguf", dense))
    with pytest.raises(ModelLoadError, match="mixture-of-experts: not yet"):
        refuse_unrunnable_model(gemma4_file("moe.gguf", [*dense, "blk.0.ffn_gate_inp.weight"]))


def test_what_the_check_cannot_read_is_left_to_the_loaders_own_errors(tmp_path):
    (tmp_path / "folder").mkdir()

    for source in (None, tmp_path / "folder", tmp_path / "missing.gguf"):
        refuse_unrunnable_model(source)


@pytest.mark.parametrize(("content", "fault"), [
    (b"GGUF\3\0\0\0", "shorter than a GGUF header"),
    (b"<!DOCTYPE html><html><body>Entry not found</body></html>", "GGUF magic bytes"),
])
def test_a_damaged_gguf_is_refused_with_the_loaders_own_error(tmp_path, content, fault):
    damaged = tmp_path / "cut.gguf"
    damaged.write_bytes(content)

    with pytest.raises(MalformedGGUFError, match=fault) as refused:
        refuse_unrunnable_model(damaged)
    with pytest.raises(MalformedGGUFError) as loaded:
        open_gguf_reader(damaged)
    assert str(refused.value) == str(loaded.value)


def test_a_gguf_cut_inside_its_tensor_data_is_refused_naming_the_tensor(tmp_path):
    whole = write_tiny_gguf(tmp_path / "whole.gguf").path
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:whole.stat().st_size // 2])

    with pytest.raises(MalformedGGUFError, match="data .* runs past"):
        refuse_unrunnable_model(cut)


def test_reading_the_headers_for_the_fit_check_refuses_the_same_files(ggufs):
    with pytest.raises(ModelLoadError, match="mixture-of-experts: not yet"):
        read_model_headers(ggufs["deepseek2"])


def test_the_check_imports_neither_torch_nor_transformers():
    probe = ("import sys; import pagoda.engine.loading.model_check; "
             "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")

    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout

    assert out.strip() == "[]"
