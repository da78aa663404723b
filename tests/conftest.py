"""Shared fixtures: the default model is loaded once per test session; the fake
OpenAI-compatible server (tests/app/backends/fake_server.py) is started once for the tests of the
backends and of the app."""

import importlib.util
import os
import socket
import struct
import sys
from pathlib import Path

import torch

# Triton decides whether to interpret when it is first imported, and transformers or torch may
# import it while other test modules are collected: without a GPU, say so before anything runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton"):
    from tests.triton_interpreter import patch_triton_language_once_a_launch

    patch_triton_language_once_a_launch()

import pytest

from pagoda.engine.loading.loader import LoadedModel, load_model

sys.path.insert(0, str(Path(__file__).parent / "app" / "backends"))  # `from fake_server import ...`
sys.path.insert(0, str(Path(__file__).parent / "engine"))  # `from tiny_gguf import ...`


@pytest.fixture(scope="session")
def default_model() -> LoadedModel:
    """The default SmolLM2-135M-Instruct (config, tokenizer, fp32 weights), loaded once.

    Dequantized ("none"): the parity tests compare it with transformers' own dequantization."""
    return load_model(quantization="none")


@pytest.fixture(scope="session")
def kernels_cache_dir(tmp_path_factory) -> Path:
    """A cache folder of this test session's own, where the engine builds our C kernels once
    (each source is built once per folder): tests that need a fresh engine start, not a fresh
    build, share it, so no test reads or fills the user's cache."""
    return tmp_path_factory.mktemp("pagoda-cache")


@pytest.fixture(scope="session")
def kernel_build_dir(kernels_cache_dir) -> Path:
    """The folder the engine builds our C kernels in under kernels_cache_dir
    (pagoda.engine.quantization.native_kernels.kernel_build_dir): tests that load a kernel themselves
    build it there too, so each source is compiled once a session (q8_gemv took ~7 s) rather
    than once per test module. Tests of building itself keep folders of their own."""
    return kernels_cache_dir / "kernels"


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory) -> Path:
    """A 2-layer random llama folder with the default model's tokenizer and chat template, for
    subprocesses whose claim is not about the default model: it loads in a moment, where the
    default model's GGUF start-up (weights repacked, kernels timed) takes ~25 s of each."""
    from tests.engine.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_gemma3_folder(tmp_path_factory) -> Path:
    """The tiny Gemma 3 (tests/engine/tiny_models.py: layers 0-4 windowed to 8 keys, layer 5
    global), for claims about a model whose KV cache keeps its windowed layers apart."""
    from tests.engine.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-gemma3"), "gemma3")


@pytest.fixture(scope="session")
def moe_ggufs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """{variant: (HF folder, llama.cpp's f16 GGUF of it)} of the tiny mixtures of experts
    llama.cpp runs (LLAMA_CPP_MOE_VARIANTS), converted once a session in one converter process
    (tens of seconds on a busy machine), for the families' tests and the window's."""
    from tests.engine.llama_cpp_converter import (
        LLAMA_CPP_MOE_VARIANTS,
        convert_tiny_variants,
        require_converter,
    )

    require_converter()
    return convert_tiny_variants(tmp_path_factory.mktemp("llama-cpp-moe"), LLAMA_CPP_MOE_VARIANTS)


@pytest.fixture(scope="session")
def make_engine(default_model):
    """Build an LLMEngine over the already-loaded default model: make_engine(num_kv_blocks=64)."""
    from pagoda.engine.config import EngineConfig
    from pagoda.engine.llm_engine import LLMEngine

    def build(**config) -> LLMEngine:
        config.setdefault("num_kv_blocks", 256)
        return LLMEngine(config=EngineConfig(**config), loaded=default_model)

    return build


@pytest.fixture(scope="session")
def make_llm(make_engine):
    """An `LLM` over the shared default model: make_llm(max_num_batched_tokens=32)."""
    from pagoda.engine.llm import LLM

    return lambda **config: LLM.from_engine(make_engine(**config))


@pytest.fixture(scope="session")
def _fake_vllm_thread():
    from fake_server import VLLM, FakeServer

    from pagoda.engine.server.runner import ServerThread

    fake = FakeServer(VLLM)
    thread = ServerThread(fake.app()).start()
    yield fake, thread
    thread.stop()


@pytest.fixture
def fake_vllm(_fake_vllm_thread):
    """The fake server in vLLM's shape, with no fault, and its API address."""
    fake, thread = _fake_vllm_thread
    fake.reset()
    return fake, f"{thread.url}/v1"


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- a fake Hugging Face Hub for the app's model library (tests/engine/hub/test_hub.py has its own) --

LIBRARY_REPO = "pagoda-test/tiny-GGUF"
LIBRARY_GATED_REPO = "pagoda-test/locked-GGUF"
LIBRARY_FOLDER_REPO = "pagoda-test/pocket-llama"  # a safetensors model folder that loads
LIBRARY_MOE_REPO = "pagoda-test/pocket-moe-GGUF"
LIBRARY_MOE_FOLDER_REPO = "pagoda-test/pocket-moe"
LIBRARY_TERNARY_REPO = "pagoda-test/ternary-GGUF"


def runnable_gguf_bytes(size: int, fill: bytes = b"\0") -> bytes:
    """size bytes that open as a GGUF file of a family Pagoda runs (llama, no tensors) and then
    `fill` repeated: what passes the pick-time check (pagoda/engine/loading/model_check.py), for tests
    whose engine is a fake."""
    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    header = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("general.architecture")
              + struct.pack("<I", 8) + string("llama"))
    return (header + fill * size)[:size]


LIBRARY_FILES = {"tiny-Q4_K_M.gguf": runnable_gguf_bytes(256 * 1200, bytes(range(256))),
                 "tiny-Q8_0.gguf": runnable_gguf_bytes(256 * 2000, bytes(range(255, -1, -1))),
                 "README.md": b"# tiny\n"}


@pytest.fixture(scope="session")
def _library_hub(tmp_path_factory):
    from tests.engine.fake_hub import FakeHub, FakeRepo, served
    from tests.engine.tiny_models import save_tiny_model

    folder = save_tiny_model(tmp_path_factory.mktemp("pocket-llama"), "llama")
    hub = FakeHub()
    hub.add(FakeRepo(LIBRARY_FOLDER_REPO, ["safetensors", "llama"],
                     {f.name: f.read_bytes() for f in folder.iterdir()}, model_type="llama",
                     num_parameters=3_300_000))
    hub.add(FakeRepo(LIBRARY_REPO, ["gguf", "llama"], dict(LIBRARY_FILES), downloads=500,
                     architecture="llama"))
    hub.add(FakeRepo(LIBRARY_GATED_REPO, ["gguf", "llama"], {"locked-Q4_K_M.gguf": b"\1" * 4096},
                     gated=True, architecture="llama"))
    hub.add(FakeRepo("pagoda-test/tiny-llama", ["safetensors", "llama"],
                     {"model.safetensors": b"\0" * 64, "config.json": b"{}"}, downloads=900))
    # What the engine does not run: a family (as GGUF and as a folder), a tensor type.
    hub.add(FakeRepo(LIBRARY_MOE_REPO, ["gguf"], {"moe-Q4_K_M.gguf": b"\2" * 4096},
                     downloads=7, architecture="deepseek2"))
    hub.add(FakeRepo(LIBRARY_MOE_FOLDER_REPO, ["safetensors", "deepseek_v3"],
                     {"model.safetensors": b"\0" * 64, "config.json": b"{}",
                      "tokenizer.json": b"{}"}, downloads=3, model_type="deepseek_v3"))
    hub.add(FakeRepo(LIBRARY_TERNARY_REPO, ["gguf", "llama"],
                     {"ternary-TQ2_0.gguf": b"\3" * 4096, "ternary-Q4_K_M.gguf": b"\4" * 4096},
                     architecture="llama"))
    with served(hub):
        yield hub


@pytest.fixture
def library_hub(_library_hub, monkeypatch, tmp_path):
    """The fake Hub as huggingface_hub's endpoint (files read in 16 kB pieces, so a tiny file
    shows progress); downloads go to tmp_path/models."""
    from tests.engine.fake_hub import use_hub

    return use_hub(_library_hub, monkeypatch, tmp_path, 16 << 10)
