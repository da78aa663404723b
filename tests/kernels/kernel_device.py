"""Where the kernel tests run: a GPU when there is one, else CPU tensors under Triton's interpreter.

TRITON_INTERPRET must be set before a kernel module is imported (`triton.jit` reads it when it
decorates), so every test module imports this first (conftest.py does too).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# bf16 is wrong under the interpreter (NaN adds, bad dots): it is checked on a real GPU only.
KERNEL_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])
TOLERANCES = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = TOLERANCES[actual.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)
