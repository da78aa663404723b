"""Bytes of every tensor some objects hold (layers, methods, plain tensors), each storage once:
a tied lm_head and its embedding share theirs."""

from __future__ import annotations

import torch


def tensor_bytes(objects: list[object]) -> int:
    seen: dict[int, int] = {}
    _visit(objects, seen, 0)
    return sum(seen.values())


def _visit(value: object, seen: dict[int, int], depth: int) -> None:
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    elif depth >= 10:
        return
    elif isinstance(value, (list, tuple)):
        for item in value:
            _visit(item, seen, depth + 1)
    elif hasattr(value, "__slots__") or hasattr(value, "__dict__"):
        for name in _attributes(value):
            _visit(getattr(value, name, None), seen, depth + 1)


def _attributes(value: object) -> list[str]:
    names = list(getattr(value, "__dict__", {}))
    for cls in type(value).__mro__:
        slots = getattr(cls, "__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
    return [n for n in names if not n.startswith("__")]
