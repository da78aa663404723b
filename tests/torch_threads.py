"""Which threads call into torch: `with torch_callers() as callers:` ... `callers.threads`.

A profile hook on every thread started inside the block (and the one that opened it) notes the
thread of each call to a torch function or tensor method implemented in C, and of each call
through `torch.ops`. It sees what runs from Python, which is how the engine reaches torch (the
torch package's pure-Python helpers, such as its patched `inspect.getfile`, compute nothing)."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

_OPS_FILE = torch._ops.__file__


@dataclass
class TorchCallers:
    calls: Counter = field(default_factory=Counter)  # thread name -> torch calls
    examples: dict[str, str] = field(default_factory=dict)  # thread name -> its first call

    @property
    def threads(self) -> set[str]:
        return set(self.calls)

    def note(self, what: str) -> None:
        name = threading.current_thread().name
        self.calls[name] += 1
        self.examples.setdefault(name, what)


def _is_torch_c_function(fn) -> bool:
    if isinstance(getattr(fn, "__self__", None), torch.Tensor):
        return True
    module = getattr(fn, "__module__", None)
    if not isinstance(module, str):
        return False
    return module == "torch" or module.startswith("torch.")


@contextmanager
def torch_callers() -> Iterator[TorchCallers]:
    callers = TorchCallers()

    def hook(frame, event, arg):
        if event == "c_call" and _is_torch_c_function(arg):
            callers.note(getattr(arg, "__qualname__", repr(arg)))
        elif event == "call" and frame.f_code.co_filename == _OPS_FILE:
            callers.note(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        yield callers
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
