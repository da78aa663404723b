"""Pagoda's wheel installs beside Hugging Face's `kernels` package (which transformers >= 5.25
requires): everything of ours is under `pagoda`, so neither shadows the other."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

IMPORT_BOTH = """
import kernels, transformers
import pagoda.kernels.ops, pagoda.engine
from pagoda.engine import SamplingParams
print(kernels.__file__)
print(pagoda.kernels.ops.__file__)
print(pagoda.engine.SamplingParams is SamplingParams)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("pagoda-*.whl")
    return built


def test_the_wheel_holds_one_top_level_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    ours = {top for top in tops if not top.endswith((".dist-info", ".data"))}
    assert ours == {"pagoda"}


def test_the_installed_wheel_imports_beside_hugging_faces_kernels(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    # The installed copy first, from a folder that is not the source tree.
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-c", IMPORT_BOTH], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    hf_kernels, ours, same = result.stdout.split()
    assert Path(hf_kernels).parent.name == "kernels" and "pagoda" not in Path(hf_kernels).parts
    assert Path(ours).is_relative_to(target)
    assert same == "True"
