"""The picker and the Hub finder's rows say a model's parameters; a mixture of experts' as its
total and what a token reads ("30.5B, 3.4B active"), a dense model's entry as before."""

import json
from pathlib import Path

import pytest

from pagoda.app.backends.services.hub import repository
from pagoda.app.components.models.model_choices import ModelChoice
from pagoda.app.components.models.model_library import file_choices, parameter_counts
from pagoda.engine.loading.model_info import ModelInfo, describe_headers, read_model_headers
from tests.engine.fake_hub import FakeHub, FakeRepo, served, use_hub
from tests.engine.moe_header_gguf import QWEN3_30B_A3B, write_moe_header_gguf

MIXTRAL_REPO, DENSE_REPO = "pagoda-test/mixtral-shaped-GGUF", "pagoda-test/dense-GGUF"
# Mixtral 8x7B's config.json (the keys its count reads) and the Hub's count of its parameters.
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_local_experts": 8, "num_experts_per_tok": 2}
MIXTRAL_PARAMETERS = 46_702_792_704
GGUF_BYTES = b"GGUF" * 100


@pytest.fixture(scope="module")
def fake_hub():
    hub = FakeHub()
    hub.add(FakeRepo(MIXTRAL_REPO, ["gguf", "llama"],
                     {"config.json": json.dumps(MIXTRAL).encode(), "m-Q4_K_M.gguf": GGUF_BYTES},
                     architecture="llama", num_parameters=MIXTRAL_PARAMETERS))
    hub.add(FakeRepo(DENSE_REPO, ["gguf", "llama"], {"m-Q4_K_M.gguf": GGUF_BYTES},
                     architecture="llama", num_parameters=7_600_000_000))
    with served(hub):
        yield hub


@pytest.fixture
def hub(fake_hub, monkeypatch, tmp_path) -> FakeHub:
    return use_hub(fake_hub, monkeypatch, tmp_path, 1 << 16)


def test_a_30b_a3b_files_picker_entry_says_30_5b_and_3_4b_active(tmp_path):
    path = write_moe_header_gguf(tmp_path / "a3b.gguf", QWEN3_30B_A3B)
    info = describe_headers(read_model_headers(path))

    choice = ModelChoice(str(path), info.name, info, size_bytes=path.stat().st_size)

    assert choice.text == "a3b · GGUF · Q4_K · 17.3 GB · 30.5B, 3.4B active"
    assert "each token goes through 8 of 128 experts" in choice.tooltip


def test_a_dense_models_picker_entry_is_as_before():
    info = ModelInfo("tiny", Path("tiny.gguf"), "gguf", "Q4_K", "Q4_K", 1_200_000_000,
                     700_000_000, 1_200_000_000, 700_000_000)

    choice = ModelChoice("tiny.gguf", "tiny", info, size_bytes=690_000_000)

    assert choice.text == "tiny · GGUF · Q4_K · 690.0 MB"
    assert "experts" not in choice.tooltip


def test_a_mixture_of_experts_hub_file_shows_its_total_and_active_parameters(hub):
    (choice,) = file_choices(repository(MIXTRAL_REPO, None))

    # 46.7B - 6/8 of 45.1B in experts
    assert choice.parameters == "46.7B, 12.9B active"
    assert "of it experts read from the file as needed" in choice.fit_detail


def test_a_dense_hub_file_shows_its_parameters_alone(hub):
    (choice,) = file_choices(repository(DENSE_REPO, None))

    assert choice.parameters == "7.6B"
    assert "experts" not in choice.fit_detail


def test_an_unknown_count_shows_nothing():
    assert parameter_counts(None, None) == ""


def test_a_models_picker_entry_counts_its_mtp_block_only_when_it_speculates(tmp_path):
    """The engine builds a multi-token-prediction block only to speculate: the memory the
    picker shows counts its weights only then."""
    from pagoda.app.backends.services.model_files import describe_headers as picker_describe
    from pagoda.engine.config import EngineConfig
    from tests.engine.spec_decode.test_mtp_drafts import add_mtp_block, mtp_tensors
    from tests.engine.tiny_models import save_tiny_model

    folder = save_tiny_model(tmp_path / "qwen3.5", "qwen3.5")
    add_mtp_block(folder)
    headers = read_model_headers(folder)
    off, on = (picker_describe(headers, "auto", EngineConfig(num_speculative_tokens=k))
               for k in (0, 2))
    block = sum(t.numel() for t in mtp_tensors(folder).values())
    assert on.num_parameters - off.num_parameters == block
    assert on.weight_bytes - off.weight_bytes == 4 * block  # fp32 on the CPU
