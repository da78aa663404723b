"""LazyWeights: weights made when first asked for, and nothing kept once emptied."""

import gc
import weakref

import pytest
import torch

from pagoda.engine.loading.lazy_weights import LazyWeights


class _Maker:
    """Stands for a GGUF file's decoder, which holds the file's reader and memory map."""

    def __call__(self, name: str) -> torch.Tensor:
        return torch.zeros(2)


def test_emptied_weights_let_go_of_what_made_them():
    maker = _Maker()
    alive = weakref.ref(maker)
    weights = LazyWeights(["a", "b"], maker)
    assert weights["a"].shape == (2,)
    del maker
    weights.clear()
    gc.collect()
    assert alive() is None
    with pytest.raises(KeyError):
        weights["b"]
