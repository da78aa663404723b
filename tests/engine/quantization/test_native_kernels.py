"""The engine builds our C kernels in its cache folder and runs on without them."""

import pytest

from pagoda.engine.quantization import native_kernels
from pagoda.kernels.cpu import native


def test_kernels_build_under_the_cache_folder(monkeypatch, tmp_path):
    if native.find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC)")
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(tmp_path))
    assert native_kernels.load_native("q4_gemv") is not None
    assert list((tmp_path / "kernels").glob("*/libq4_gemv.so"))


def test_no_compiler_means_none_and_one_warning(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(native_kernels, "_unavailable", {})
    with caplog.at_level("WARNING"):
        assert native_kernels.load_native("q4_gemv") is None
        assert native_kernels.load_native("q4_gemv") is None
    assert [r.getMessage() for r in caplog.records if "q4_gemv" in r.getMessage()] == [
        caplog.records[0].getMessage()]
    assert "no-such-cc" in caplog.records[0].getMessage()


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("PAGODA_NATIVE_KERNELS", "0")
    assert native_kernels.load_native("q4_gemv") is None


def test_unknown_switch_value_is_refused(monkeypatch):
    monkeypatch.setenv("PAGODA_NATIVE_KERNELS", "yes")
    with pytest.raises(ValueError, match="PAGODA_NATIVE_KERNELS"):
        native_kernels.load_native("q4_gemv")


def test_report_names_every_kernel_and_where_it_came_from(monkeypatch, kernels_cache_dir):
    # The session's cache folder: each kernel is built there once (building into a fresh folder
    # is the test above's), not all of them again for this report (~15 s).
    if native.find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC)")
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(kernels_cache_dir))
    report = native_kernels.kernel_report()
    assert "q4_gemv" in report
    assert set(report.values()) <= {"built", "prebuilt"}


def test_prebuilt_library_is_preferred_and_reported(monkeypatch, tmp_path):
    if native.find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC)")
    shipped = tmp_path / "shipped"
    lib = native.build_prebuilt("q4_gemv", shipped)
    assert lib == shipped / "libq4_gemv.so"
    # An installer's layout: only the library beside the Python, no source, no compiler.
    monkeypatch.setattr(native, "SOURCE_DIR", shipped)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(tmp_path / "cache"))
    assert native_kernels.kernel_report() == {"q4_gemv": "prebuilt"}
