"""Shared fixtures: the default model is loaded once per test session; the fake
OpenAI-compatible server (tests/backends/fake_server.py) is started once for the tests of the
backends and of the app."""

import os
import socket
import sys
from pathlib import Path

import torch

# Triton decides whether to interpret when it is first imported, and transformers or torch may
# import it while other test modules are collected: without a GPU, say so before anything runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from engine.loader import LoadedModel, load_model

sys.path.insert(0, str(Path(__file__).parent / "backends"))  # `from fake_server import ...`


@pytest.fixture(scope="session")
def default_model() -> LoadedModel:
    """The default SmolLM2-135M-Instruct (config, tokenizer, fp32 weights), loaded once.

    Dequantized ("none"): the parity tests compare it with transformers' own dequantization."""
    return load_model(quantization="none")


@pytest.fixture(scope="session")
def make_engine(default_model):
    """Build an LLMEngine over the already-loaded default model: make_engine(num_kv_blocks=64)."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    def build(**config) -> LLMEngine:
        config.setdefault("num_kv_blocks", 256)
        return LLMEngine(config=EngineConfig(**config), loaded=default_model)

    return build


@pytest.fixture(scope="session")
def make_llm(make_engine):
    """An `LLM` over the shared default model: make_llm(max_num_batched_tokens=32)."""
    from engine.llm import LLM

    return lambda **config: LLM.from_engine(make_engine(**config))


@pytest.fixture(scope="session")
def _fake_vllm_thread():
    from fake_server import VLLM, FakeServer

    from engine.server.runner import ServerThread

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
