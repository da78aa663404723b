"""Fixtures shared by the engine tests."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def kernels_cache_dir(tmp_path_factory) -> Path:
    """A cache folder of this test session's own, where the engine builds our C kernels once
    (each source is built once per folder): tests that need a fresh engine start, not a fresh
    build, share it, so no test reads or fills the user's cache."""
    return tmp_path_factory.mktemp("pagoda-cache")
