"""Fixtures of the model families' tests."""

import pytest


@pytest.fixture(scope="module")
def fresh_gguf_metadata_cache(tmp_path_factory):
    """GGUF configs and tokenizers cached in a folder of this module's own: the tiny families'
    files are the same bytes in every run, and a config cached by an earlier run (or an earlier
    version of the code that builds it) would stand in for the one under test."""
    folder = tmp_path_factory.mktemp("gguf-metadata")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pagoda.engine.loading.loader.cache_dir", lambda: folder)
        yield
