"""A damaged or crafted GGUF header is refused quickly, naming the file and the field, before
anything is allocated for the counts it claims; real files pass the check unchanged."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QType
from gguf import GGUFValueType as VType
from tiny_gguf import raw_array, raw_gguf, raw_key, raw_string, raw_tensor_info, write_tiny_gguf

from pagoda.engine.errors import MalformedGGUFError
from pagoda.engine.loading.gguf_header import check_gguf_header
from pagoda.engine.loading.loader import default_model_file, load_model
from pagoda.engine.loading.model_info import describe_model

ROOT = Path(__file__).resolve().parents[3]
# Well above what the engine's modules take once imported (~0.7 GB of address space), far below
# what the crafted counts would make gguf-py allocate.
MEMORY_CEILING = 3 << 30
NAME = raw_key("general.name", VType.STRING, raw_string("tiny"))

CRAFTED = {
    # Like the outside probe's file: a 96-byte file whose array claims 2^40 u64 values.
    "array_of_2_40_numbers": (
        raw_gguf([raw_key("tokenizer.ggml.token_ids", VType.ARRAY,
                          raw_array(VType.UINT64, 1 << 40, bytes(16)))]),
        "tokenizer.ggml.token_ids"),
    "array_of_2_40_strings": (
        raw_gguf([raw_key("tokenizer.ggml.tokens", VType.ARRAY,
                          raw_array(VType.STRING, 1 << 40, raw_string("a")))]),
        "tokenizer.ggml.tokens"),
    "string_of_2_60_bytes": (
        raw_gguf([raw_key("general.name", VType.STRING, raw_string("tiny", length=1 << 60))]),
        "general.name"),
    "key_name_of_2_60_bytes": (raw_gguf([raw_string("k", length=1 << 60)]), "metadata key 0"),
    "2_50_tensors": (raw_gguf([NAME], tensor_count=1 << 50), "tensor count"),
    "2_40_keys": (raw_gguf([NAME], key_count=1 << 40), "key count"),
    "dims_whose_product_overflows_64_bits": (
        raw_gguf([NAME], [raw_tensor_info("token_embd.weight", (1 << 33, 1 << 31))]),
        "token_embd.weight"),
    "2_31_dims": (
        raw_gguf([NAME], [raw_tensor_info("token_embd.weight", (8,), n_dims=1 << 31)]),
        "token_embd.weight"),
    "tensor_data_past_the_end": (
        raw_gguf([NAME], [raw_tensor_info("output_norm.weight", (8,), offset=1 << 62)],
                 data=bytes(32)),
        "output_norm.weight"),
    "arrays_nested_without_end": (
        raw_gguf([raw_key("general.tags", VType.ARRAY,
                          raw_array(VType.ARRAY, 1, raw_array(VType.ARRAY, 1) * 200))]),
        "general.tags"),
}

# Opens each file as the engine does, under a memory ceiling, and tells what happened and how
# long it took: a regression must fail this test, not eat the machine.
PROBE = textwrap.dedent("""
    import json, resource, sys, time
    from pathlib import Path
    resource.setrlimit(resource.RLIMIT_AS, ({ceiling}, {ceiling}))
    from pagoda.engine.loading.gguf import open_gguf_reader
    results = {{}}
    for path in sys.argv[1:]:
        start = time.monotonic()
        try:
            open_gguf_reader(Path(path))
            outcome = ["opened", ""]
        except BaseException as error:
            outcome = [type(error).__name__, str(error)]
        results[Path(path).stem] = [*outcome, time.monotonic() - start]
    print(json.dumps(results))
""").format(ceiling=MEMORY_CEILING)


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, tuple[str, str, float]]:
    folder = tmp_path_factory.mktemp("crafted")
    paths = []
    for name, (data, _) in CRAFTED.items():
        paths.append(folder / f"{name}.gguf")
        paths[-1].write_bytes(data)
    done = subprocess.run([sys.executable, "-c", PROBE, *map(str, paths)], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_header_is_refused_at_once_naming_the_file_and_the_field(refusals, case):
    kind, message, seconds = refusals[case]
    assert kind == "MalformedGGUFError", message
    assert f"{case}.gguf" in message and CRAFTED[case][1] in message
    assert seconds < 1


def test_a_crafted_file_is_refused_by_the_model_picker_and_the_loader(tmp_path):
    path = tmp_path / "crafted.gguf"
    path.write_bytes(CRAFTED["tensor_data_past_the_end"][0])
    for read in (describe_model, load_model):
        with pytest.raises(MalformedGGUFError, match="runs past the file's end") as error:
            read(path)
        assert str(path) in str(error.value)


def test_a_header_that_is_all_there_but_the_data_is_cut_short_is_refused(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q8_0).path
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(MalformedGGUFError, match="past the file's end"):
        check_gguf_header(path)


def test_a_non_power_of_two_alignment_is_refused(tmp_path):
    path = tmp_path / "aligned.gguf"
    path.write_bytes(raw_gguf([raw_key("general.alignment", VType.UINT32, b"\x03\0\0\0")]))
    with pytest.raises(MalformedGGUFError, match="general.alignment"):
        check_gguf_header(path)


@pytest.mark.parametrize("kind", [QType.F32, QType.Q4_0, QType.Q4_K, QType.Q6_K, QType.Q8_0],
                         ids=lambda k: k.name)
def test_files_written_by_gguf_py_pass_the_check(tmp_path, kind):
    check_gguf_header(write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=kind).path)


def test_the_default_models_header_is_checked_in_a_fraction_of_its_load():
    start = time.monotonic()
    check_gguf_header(default_model_file())
    assert time.monotonic() - start < 0.5
