"""`python -m pagoda.engine serve`'s way of building and serving: from the load to streamed replies and
embeddings, only the engine thread calls into torch (not the HTTP thread, nor the
tokenizers')."""

from openai import OpenAI
from tiny_gguf import QType, write_tiny_gguf
from torch_threads import torch_callers

from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.config import EngineConfig
from pagoda.engine.server.api import build_app
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel


def test_serving_runs_torch_on_the_engine_thread_only(tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q4_0).path
    with torch_callers() as callers:
        engine = AsyncEngine(model, EngineConfig(num_kv_blocks=16))
        served = ServedModel("tiny", engine, engine.max_model_len)
        server = ServerThread(build_app(lambda: served)).start()
        try:
            client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                            timeout=60)
            stream = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4,
                temperature=0, stream=True)
            assert any(chunk.choices and chunk.choices[0].finish_reason for chunk in stream)
            completion = client.completions.create(model="tiny", prompt="hello", max_tokens=4,
                                                   temperature=0)
            assert completion.usage.completion_tokens == 4
            vectors = client.embeddings.create(model="tiny", input=["hello", "a longer text"])
            assert len(vectors.data) == 2
        finally:
            server.stop()
            engine.shutdown()
    assert callers.threads == {"pagoda-engine"}, callers.examples
