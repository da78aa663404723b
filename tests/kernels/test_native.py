"""pagoda/kernels/cpu/native.py builds a C kernel once per source and compiler, and says why it cannot."""

import pytest

from pagoda.kernels.cpu import native


@pytest.fixture
def compiler() -> str:
    found = native.find_compiler()
    if found is None:
        pytest.skip("no C compiler (gcc or $CC)")
    return found


def test_second_build_reuses_the_library_without_compiling(tmp_path, compiler):
    first = native.build("q4_gemv", tmp_path, compiler)
    built_at = first.stat().st_mtime_ns
    second = native.build("q4_gemv", tmp_path, compiler)
    assert second == first and second.stat().st_mtime_ns == built_at
    assert [p.name for p in first.parent.iterdir()] == ["libq4_gemv.so"]


def test_missing_compiler_is_refused_by_name(tmp_path):
    with pytest.raises(native.NativeBuildError, match="no-such-cc"):
        native.build("q4_gemv", tmp_path, "/nonexistent/no-such-cc")


def test_no_prebuilt_library_and_no_folder_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "SOURCE_DIR", tmp_path)
    with pytest.raises(native.NativeBuildError, match="no prebuilt library"):
        native.load("q4_gemv", None)


def test_loaded_library_shares_torchs_openmp_runtime(tmp_path, compiler):
    native.load("q4_gemv", tmp_path, compiler)
    assert native.mapped_openmp_runtimes() == {str(native.torch_openmp_runtime().resolve())}


def test_a_changed_header_builds_a_new_library(monkeypatch, tmp_path, compiler):
    sources = tmp_path / "src"
    sources.mkdir()
    for path in (native.SOURCE_DIR / "dequant.c", *native.SOURCE_DIR.glob("*.h")):
        (sources / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(native, "SOURCE_DIR", sources)
    first = native.build("dequant", tmp_path / "built", compiler)
    with open(sources / "half_float.h", "a") as header:
        header.write("/* edited */\n")
    assert native.build("dequant", tmp_path / "built", compiler) != first
