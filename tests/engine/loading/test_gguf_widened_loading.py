"""GGUF files of the types without a kernel of their own (IQ*, Q2_K, MXFP4, Q5_0/1) load:
widened to int8 under "auto", which the load log says once per type, float under "none"; the
model runs as its float self and the memory estimate counts the int8 it becomes."""

import dataclasses
import logging

import pytest
import torch
from dequantized_self import PROMPT_IDS
from gguf import GGMLQuantizationType as QType
from tiny_gguf import write_tiny_gguf

from pagoda.engine.config import EngineConfig
from pagoda.engine.loading.gguf_blocks import EXACT_TYPES
from pagoda.engine.loading.loader import load_model
from pagoda.engine.loading.model_info import describe_model
from pagoda.engine.quantization.tensors import Int8Weight, dequantize
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner

# Every widened type in two files: a base type for the matrices, others per GGUF module. The
# first file's types widen exactly, the second's are requantized.
MIXES = {
    "exact": (QType.IQ4_NL, {
        "token_embd": QType.MXFP4, "attn_q": QType.IQ2_XXS, "attn_k": QType.IQ3_XXS,
        "attn_v": QType.IQ3_S, "attn_output": QType.Q5_0, "ffn_gate": QType.IQ1_S,
        "ffn_up": QType.Q5_1}),
    "requantized": (QType.Q2_K, {
        "token_embd": QType.Q2_K, "attn_q": QType.IQ2_XS, "attn_k": QType.IQ2_S,
        "attn_v": QType.IQ1_M}),
}
LOG_LINE = "{}: no native kernel yet, widened to int8 at load"


@pytest.fixture(autouse=True)
def session_cache(kernels_cache_dir, monkeypatch):
    """Our C kernels built once a session, and each file's tokenizer cached there once."""
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(kernels_cache_dir))


@pytest.fixture(scope="module", params=MIXES)
def mixed_file(request, tmp_path_factory):
    matrix_type, mixed = MIXES[request.param]
    path = write_tiny_gguf(tmp_path_factory.mktemp("widened") / f"{request.param}.gguf",
                           matrix_type=matrix_type, mixed=mixed).path
    return path, {matrix_type, *mixed.values()}


def logits(model) -> torch.Tensor:
    return prompt_logits(ModelRunner(model, EngineConfig(num_kv_blocks=32)), PROMPT_IDS[:64])


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm(dim=-1) / want.norm(dim=-1)).mean().item()


def test_widened_model_runs_as_its_dequantized_self(mixed_file, kernels_at_every_step):
    path, kinds = mixed_file
    widened = load_model(path)
    assert all(isinstance(widened.weights[name], Int8Weight)
               for name in widened.weights if name.endswith("proj.weight"))
    dequantized = dataclasses.replace(widened, weights={
        name: weight if isinstance(weight, torch.Tensor) else dequantize(weight)
        for name, weight in widened.weights.items()})
    got = logits(widened)
    assert relative_error(got, logits(dequantized)) < 0.01
    if kinds <= EXACT_TYPES:  # its dequantized self is the file's own values
        assert relative_error(got, logits(load_model(path, quantization="none"))) < 0.01


def test_load_log_names_each_widened_type_once(mixed_file, caplog):
    path, kinds = mixed_file
    with caplog.at_level(logging.INFO, logger="pagoda.engine.loading.gguf_blocks"):
        load_model(path)
    lines = [record.getMessage() for record in caplog.records]
    assert sorted(line for line in lines if "widened" in line) == sorted(
        LOG_LINE.format(kind.name) for kind in kinds)


def test_none_widens_nothing_and_says_nothing(mixed_file, caplog):
    path, _ = mixed_file
    with caplog.at_level(logging.INFO, logger="pagoda.engine.loading.gguf_blocks"):
        model = load_model(path, quantization="none")
    assert all(isinstance(weight, torch.Tensor) for weight in model.weights.values())
    assert not any("widened" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("kind", [QType.IQ4_NL, QType.Q2_K, QType.MXFP4], ids=lambda k: k.name)
def test_memory_estimate_counts_a_widened_type_as_the_int8_it_becomes(tmp_path, kind):
    widened = write_tiny_gguf(tmp_path / f"tiny.{kind.name}.gguf", matrix_type=kind).path
    q8_0 = write_tiny_gguf(tmp_path / "tiny.Q8_0.gguf", matrix_type=QType.Q8_0).path
    assert describe_model(widened).weight_bytes == describe_model(q8_0).weight_bytes
