"""Weights made when first asked for, and forgotten when deleted.

A GGUF file is memory-mapped and its tensors are decoded one at a time as the model's layers
take them; with the layers emptying the mapping as they go (`release_weights`), the loader's
layout and the kernels' never both hold a whole model: a 7B Q4_K file would otherwise peak at
about twice its size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, MutableMapping

from pagoda.engine.quantization.tensors import Weight


class LazyWeights(MutableMapping[str, Weight]):
    def __init__(self, names: Iterable[str], make: Callable[[str], Weight]) -> None:
        self._names = dict.fromkeys(names)
        self._make = make
        self._made: dict[str, Weight] = {}

    def __getitem__(self, name: str) -> Weight:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._made:
            self._made[name] = self._make(name)
        return self._made[name]

    def __setitem__(self, name: str, weight: Weight) -> None:
        self._names[name] = None
        self._made[name] = weight

    def __delitem__(self, name: str) -> None:
        del self._names[name]
        self._made.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def clear(self) -> None:
        """Forget every weight and what makes them: a GGUF file's maker holds its reader, whose
        memory map and parsed header (the vocabulary's tens of thousands of fields) would
        otherwise stay resident beside the model built from it."""
        self._names.clear()
        self._made.clear()
        self._make = _nothing_left


def _nothing_left(name: str) -> Weight:
    raise KeyError(name)
