"""pagoda/engine/loading/system_memory.py tells the memory the machine has and can give now."""

import sys

from pagoda.engine.loading.system_memory import available_memory, total_memory


def test_available_memory_is_measured():
    assert available_memory() > 0


def test_available_memory_without_psutil_reads_meminfo(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now raises ImportError
    assert available_memory() > 0


def test_total_memory_without_psutil_reads_meminfo_and_exceeds_the_available(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)
    assert total_memory() >= available_memory() > 0
