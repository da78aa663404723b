"""LlamaIndex's OpenAILike.structured_predict with its default program (is_function_calling_model
False) against the real server returns the pydantic object. It sends tool_choice "required" with
no tools, which the server answers as a chat without tools (test_tools_api.py).

LlamaIndex's OpenAI package needs openai<3 and the test extra's openai-agents needs openai>=3, so
LlamaIndex lives in a Python of its own: PAGODA_LLAMAINDEX_PYTHON names it (a venv with
`pip install llama-index-llms-openai-like>=0.8.1`), and llamaindex_client.py runs there."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.engine.server.conftest import MODEL

PYTHON = os.environ.get("PAGODA_LLAMAINDEX_PYTHON")
CLIENT = Path(__file__).with_name("llamaindex_client.py")


@pytest.mark.skipif(not PYTHON, reason="PAGODA_LLAMAINDEX_PYTHON is not set: a Python with "
                    "llama-index-llms-openai-like (it needs openai<3, the test extra openai>=3)")
def test_structured_predict_returns_the_pydantic_object(server):
    done = subprocess.run([PYTHON, str(CLIENT), f"{server.url}/v1", MODEL], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    city = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(city) == {"name", "country"} and all(isinstance(v, str) for v in city.values())
