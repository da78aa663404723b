"""pagoda.kernels.ops picks Triton on CUDA and torch elsewhere, can be forced, and needs no triton for
the torch path."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pagoda.kernels.kernel_ops import TORCH_OPS
from pagoda.kernels.ops import BACKEND_ENV, select_ops

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_cpu_tensors_get_the_torch_reference(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert select_ops(CPU) is TORCH_OPS


def test_cuda_gets_triton_unless_torch_is_forced(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert select_ops(CUDA).name == "triton"
    assert select_ops(CUDA, "torch") is TORCH_OPS


def test_environment_variable_forces_a_backend(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "triton")
    assert select_ops(CPU).name == "triton"
    assert select_ops(CPU, "torch") is TORCH_OPS  # an explicit argument wins


def test_unknown_backend_is_named_in_the_error():
    with pytest.raises(ValueError, match="cuda-graphs"):
        select_ops(CPU, "cuda-graphs")


def test_engine_imports_and_runs_the_torch_path_without_triton():
    script = """
import sys
sys.modules["triton"] = None  # as if triton were not installed
import pagoda.engine, pagoda.engine.worker.model_runner
from pagoda.kernels.ops import select_ops
import torch
assert select_ops(torch.device("cpu")).name == "torch"
try:
    select_ops(torch.device("cpu"), "triton")
except ImportError as exc:
    assert "kernel_backend='torch'" in str(exc)
else:
    raise AssertionError("forcing Triton without triton must fail")
"""
    # A bare environment (no TRITON_INTERPRET), but the packages a machine was lent with stay
    # findable (PYTHONPATH).
    env = {"PATH": "/usr/bin:/bin"} | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True,
                            text=True, env=env, timeout=120, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stderr
