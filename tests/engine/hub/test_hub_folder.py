"""A safetensors repository fetched as a model folder, against the fake Hub on 127.0.0.1
(fake_hub.py) serving a tiny Llama in two shards: the folder loads, resumes and is checked."""

import json
import threading
from pathlib import Path

import pytest
from fake_hub import FakeHub, FakeRepo, served, use_hub
from safetensors.torch import load_file, save_file
from tiny_models import save_tiny_model

from pagoda.engine.errors import (
    ChecksumMismatchError,
    DownloadCancelledError,
    HubNotFoundError,
    HubUnreachableError,
)
from pagoda.engine.hub.download import download_model_folder
from pagoda.engine.hub.search import HubFile, HubRepo, folder_files, repo_info

FOLDER_REPO = "pagoda-test/tiny-llama-sharded"
NO_CONFIG_REPO = "pagoda-test/tiny-llama-no-config"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"
# What the folder needs is fetched; the rest of the repository is not.
NOT_NEEDED = {"pytorch_model.bin": b"pickle", "original/consolidated.00.pth": b"pth",
              "onnx/model.onnx": b"onnx", "README.md": b"# tiny\n"}
CHUNK = 64 << 10
DROP_AT = 1_000_000


@pytest.fixture(scope="module")
def folder_bytes(tmp_path_factory) -> dict[str, bytes]:
    """A tiny Llama folder whose weights are split in two shards with their index."""
    folder = save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = (names[: len(names) // 2], names[len(names) // 2:])
    for shard, shard_names in zip(SHARDS, halves, strict=True):
        save_file({n: tensors[n] for n in shard_names}, folder / shard, metadata={"format": "pt"})
    weight_map = {n: shard for shard, ns in zip(SHARDS, halves, strict=True) for n in ns}
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {f.name: f.read_bytes() for f in folder.iterdir()}


@pytest.fixture(scope="module")
def fake_hub(folder_bytes):
    hub = FakeHub()
    hub.add(FakeRepo(FOLDER_REPO, ["safetensors", "llama"], {**folder_bytes, **NOT_NEEDED},
                     model_type="llama", num_parameters=3_300_000))
    without_config = {n: b for n, b in folder_bytes.items() if n != "config.json"}
    hub.add(FakeRepo(NO_CONFIG_REPO, ["safetensors", "llama"], without_config))
    with served(hub):
        yield hub


@pytest.fixture
def hub(fake_hub, monkeypatch, tmp_path) -> FakeHub:
    return use_hub(fake_hub, monkeypatch, tmp_path, CHUNK)


def folder_path(tmp_path: Path) -> Path:
    return tmp_path / "models" / "pagoda-test" / "tiny-llama-sharded"


def test_a_safetensors_repository_downloads_as_a_folder_that_loads_and_answers(
        hub, folder_bytes, tmp_path):
    from pagoda.engine.config import EngineConfig
    from pagoda.engine.llm_engine import LLMEngine
    from pagoda.engine.loading.loader import load_model
    from pagoda.engine.sampling.params import SamplingParams

    events = []

    folder = download_model_folder(FOLDER_REPO, on_progress=events.append)

    assert folder == folder_path(tmp_path)
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == folder_bytes
    total = sum(len(data) for data in folder_bytes.values())
    done = [e.done for e in events]
    assert done == sorted(done) and done[-1] == events[-1].total == total
    assert {e.total for e in events} == {total}  # the whole folder's bytes, not one file's
    engine = LLMEngine(config=EngineConfig(num_kv_blocks=16), loaded=load_model(folder))
    engine.add_request("r", "hello", SamplingParams(temperature=0.0, max_tokens=4,
                                                     ignore_eos=True))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert len(outputs[-1].outputs[0].token_ids) == 4


def test_config_json_is_fetched_last_and_nothing_else_of_the_repository(hub, folder_bytes):
    download_model_folder(FOLDER_REPO)

    fetched = [d.filename for d in hub.downloads if d.method == "GET"]
    assert sorted(fetched) == sorted(folder_bytes)
    assert fetched[-1] == "config.json"


def test_a_folder_lost_mid_shard_is_no_model_and_the_next_call_fetches_only_the_rest(
        hub, folder_bytes, tmp_path):
    hub.fault.drop_at, hub.fault.drops, hub.fault.only = DROP_AT, 6, SHARDS[0]

    with pytest.raises(HubUnreachableError, match="next download resumes"):
        download_model_folder(FOLDER_REPO)

    folder = folder_path(tmp_path)
    assert not (folder / "config.json").exists()
    kept = [p for p in folder.iterdir() if p.name.endswith(".incomplete")]
    assert [p.name.split(".")[0] for p in kept] == [SHARDS[0].split(".")[0]]
    have = kept[0].stat().st_size
    before = {d.filename for d in hub.downloads if d.method == "GET"}
    hub.reset()

    download_model_folder(FOLDER_REPO)

    assert {f.name: f.read_bytes() for f in folder.iterdir()} == folder_bytes
    assert [d.range for d in hub.gets(SHARDS[0])] == [f"bytes={have}-"]
    refetched = {d.filename for d in hub.downloads if d.method == "GET"} & before
    assert refetched == {SHARDS[0]}


def test_a_corrupt_shard_is_rejected_and_the_folder_is_left_unfinished(hub, tmp_path):
    hub.fault.corrupt, hub.fault.only = True, SHARDS[1]

    with pytest.raises(ChecksumMismatchError, match=f"{SHARDS[1]} .* arrived damaged"):
        download_model_folder(FOLDER_REPO)

    names = {p.name for p in folder_path(tmp_path).iterdir()}
    assert SHARDS[1] not in names and "config.json" not in names
    assert not any(name.endswith(".incomplete") for name in names)


def test_a_repository_without_config_json_is_not_offered_as_a_folder(hub):
    assert repo_info(NO_CONFIG_REPO).folder_files == []

    with pytest.raises(HubNotFoundError, match=f"{NO_CONFIG_REPO} is not a model folder"):
        download_model_folder(NO_CONFIG_REPO)

    assert hub.gets("tokenizer.json") == []


def test_pull_of_a_repository_without_gguf_files_fetches_its_folder(hub, tmp_path, capsys):
    from pagoda.engine.cli.main import main

    assert main(["pull", FOLDER_REPO]) == 0

    assert Path(capsys.readouterr().out.strip()) == folder_path(tmp_path)
    assert (folder_path(tmp_path) / "config.json").is_file()


def test_pull_says_when_a_repository_is_neither_gguf_nor_a_folder(hub, capsys):
    from pagoda.engine.cli.main import main

    assert main(["pull", NO_CONFIG_REPO]) == 2

    assert "not a model folder Pagoda loads" in capsys.readouterr().err


def hub_files(*names: str) -> list[HubFile]:
    return [HubFile(name, 10, None, None, None) for name in names]


def test_a_folder_is_config_weights_and_tokenizer_with_config_last():
    files = hub_files("README.md", "config.json", "model.safetensors", "tokenizer.json",
                      "tokenizer_config.json", "generation_config.json", "pytorch_model.bin",
                      "consolidated.safetensors", "original/model.safetensors", "onnx/m.onnx")

    chosen = [f.filename for f in folder_files(files)]

    assert chosen == ["generation_config.json", "model.safetensors", "tokenizer.json",
                      "tokenizer_config.json", "config.json"]


def test_a_sharded_folder_takes_every_shard_and_the_index():
    files = hub_files("config.json", *SHARDS, INDEX, "consolidated.safetensors",
                      "model.safetensors", "tokenizer.model")

    chosen = {f.filename for f in folder_files(files)}

    assert chosen == {"config.json", *SHARDS, INDEX, "tokenizer.model"}


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_folder_missing_config_weights_or_tokenizer_is_none(missing):
    names = {"config.json", "model.safetensors", INDEX, "tokenizer.json", "model.bin"} - {missing}

    assert folder_files(hub_files(*sorted(names))) == []


def test_a_model_type_the_engine_does_not_run_is_not_a_folder():
    files = hub_files("config.json", "model.safetensors", "tokenizer.json")

    assert HubRepo("o/bert", "c0ffee", files, model_type="bert").folder_files == []
    assert len(HubRepo("o/llama", "c0ffee", files, model_type="llama").folder_files) == 3


def test_a_cancelled_folder_resumes_with_progress_counting_the_bytes_already_on_disk(
        hub, folder_bytes, tmp_path, monkeypatch):
    monkeypatch.setattr("pagoda.engine.hub.download._REPORT_INTERVAL_S", 0.0)
    cancel = threading.Event()

    with pytest.raises(DownloadCancelledError, match="resumes"):
        download_model_folder(FOLDER_REPO, cancel=cancel,
                              on_progress=lambda p: cancel.set() if p.done > DROP_AT else None)
    on_disk = sum(p.stat().st_size for p in folder_path(tmp_path).iterdir())
    events = []

    download_model_folder(FOLDER_REPO, on_progress=events.append)

    total = sum(len(data) for data in folder_bytes.values())
    assert DROP_AT < events[0].done == on_disk < total
    assert events[-1].done == total
