"""LlamaIndex's OpenAILike.structured_predict with its default program (is_function_calling_model
False) against the real server returns the pydantic object. It sends tool_choice "required" with
no tools, which the server answers as a chat without tools (test_tools_api.py).

LlamaIndex's OpenAI package needs openai<3 and the test extra's openai-agents needs openai>=3, so
LlamaIndex and its openai live in a folder of their own, put first on the path of the process
llamaindex_client.py runs in: .venv/share/llamaindex, which `make install` fills (pip install
--target), or the Python that PAGODA_LLAMAINDEX_PYTHON names (a venv of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.server.conftest import MODEL

CLIENT = Path(__file__).with_name("llamaindex_client.py")
FOLDER = Path(sys.prefix) / "share" / "llamaindex"  # the Makefile's LLAMAINDEX_DIR


def _python() -> tuple[str, str] | None:
    """The Python to run the client with, and its PYTHONPATH."""
    named = os.environ.get("PAGODA_LLAMAINDEX_PYTHON")
    if named:
        return named, ""
    if (FOLDER / "llama_index").is_dir():
        return sys.executable, str(FOLDER)
    return None


@pytest.mark.skipif(_python() is None, reason=f"no LlamaIndex: `make install` puts it in "
                    f"{FOLDER} (it needs openai<3, the test extra openai>=3)")
def test_structured_predict_returns_the_pydantic_object(server):
    python, path = _python()
    done = subprocess.run([python, str(CLIENT), f"{server.url}/v1", MODEL], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-2000:]
    city = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(city) == {"name", "country"} and all(isinstance(v, str) for v in city.values())


@pytest.mark.skipif(_python() is None, reason=f"no LlamaIndex: `make install` puts it in "
                    f"{FOLDER} (it needs openai<3, the test extra openai>=3)")
def test_structured_predict_with_every_default_fails_in_llamaindex_before_sending(start_server,
                                                                                 served):
    """OpenAILike's default is_chat_model=False takes LlamaIndex to the completions route, where it
    passes structured_predict's tool_choice on to the openai SDK's completions.create, which has
    no such argument: a TypeError in the client, before any request (llama-index-core 0.14.25,
    llama-index-llms-openai 0.8.3, the newest on PyPI). No server can answer it. When LlamaIndex
    mends it this test fails: then the default path must return the object, as above."""
    asked = []  # the server looks its model up once per request
    server = start_server(source=lambda: asked.append(1) or served)
    python, path = _python()
    done = subprocess.run([python, str(CLIENT), f"{server.url}/v1", MODEL, "--defaults"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode != 0
    assert "Completions.create() got an unexpected keyword argument 'tool_choice'" in done.stderr
    assert asked == []
