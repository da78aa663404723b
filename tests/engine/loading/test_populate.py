"""pagoda/engine/loading/populate.py maps a file's pages into the process before anything reads them."""

import resource
import sys

import numpy as np
import pytest

from pagoda.engine.loading.populate import populate, populate_in_background

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="MADV_POPULATE_READ is Linux's")
# 32 MB: at least 16 faults cold even where the page cache holds it in 2 MB folios.
PAGES = 8192


def _faults_reading(array: np.ndarray) -> int:
    """The minor page faults of reading one byte of every page of array."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    int(array[::4096].sum())
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _mapped_file(tmp_path, name: str) -> np.ndarray:
    path = tmp_path / name
    path.write_bytes(np.arange(PAGES * 4096, dtype=np.uint8).tobytes())
    return np.memmap(path, dtype=np.uint8, mode="r")


def test_a_populated_mapping_is_read_without_page_faults(tmp_path):
    cold = _mapped_file(tmp_path, "cold.bin")
    assert _faults_reading(cold) >= 16  # a fault maps 16 pages, or a large folio
    warm = _mapped_file(tmp_path, "warm.bin")
    if not populate([warm[4096 * 3 + 100:]]):
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux 5.14+)")
    assert _faults_reading(warm[4096 * 3:]) <= 2  # the reading's own allocations


def test_experts_larger_than_the_memory_available_are_left_to_fault_in(tmp_path, monkeypatch):
    array = _mapped_file(tmp_path, "big.bin")
    monkeypatch.setattr("pagoda.engine.loading.populate.available_memory", lambda: array.nbytes - 1)
    assert populate_in_background([array]) is None
    monkeypatch.setattr("pagoda.engine.loading.populate.available_memory", lambda: array.nbytes)
    thread = populate_in_background([array])
    assert thread is not None
    thread.join(timeout=30)
    assert _faults_reading(array) <= 2

