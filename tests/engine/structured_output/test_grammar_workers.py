"""Constraints compile in child processes: one too slow to compile is stopped at its deadline or
when its caller leaves, and holds up no other constraint."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from pagoda.engine.errors import EngineDeadError, StructuredOutputError
from pagoda.engine.structured_output.vocabulary import Vocabulary
from pagoda.engine.structured_output.workers import GrammarWorkers
from tests.engine.structured_output.schemas import SLOW_REGEX

pytestmark = pytest.mark.slow  # each test starts compile processes (xgrammar imports torch)

PERSON = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'


@pytest.fixture(scope="module")
def vocabulary(default_model) -> Vocabulary:
    return Vocabulary(default_model.tokenizer, default_model.config.vocab_size, [2])


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


async def _started(workers: GrammarWorkers, count: int) -> list[int]:
    while len(workers.process_ids()) < count:
        await asyncio.sleep(0.05)
    return workers.process_ids()


def test_a_schema_compiles_while_a_slow_regex_is_still_compiling(vocabulary):
    workers = GrammarWorkers(vocabulary, timeout_s=600)

    async def run():
        slow = asyncio.ensure_future(workers.compile("regex", SLOW_REGEX))
        await _started(workers, 1)
        schema = await workers.compile("json", PERSON)
        assert not slow.done()  # the schema did not wait for the regex's minute
        slow.cancel()
        await asyncio.gather(slow, return_exceptions=True)
        return schema

    try:
        assert asyncio.run(run()) is not None
    finally:
        workers.close()


def test_a_regex_past_the_deadline_is_refused_in_words(vocabulary):
    workers = GrammarWorkers(vocabulary, timeout_s=2)

    async def run():
        await workers.compile("regex", "a+")  # the process started: the deadline is compiling's
        started = time.monotonic()
        with pytest.raises(StructuredOutputError, match="did not compile within 2 s"):
            await workers.compile("regex", SLOW_REGEX)
        return time.monotonic() - started

    try:
        waited = asyncio.run(run())
    finally:
        workers.close()
    assert waited < 30  # the deadline, not the minute the compile would take


def test_a_cancelled_compile_ends_its_process_and_others_go_on(vocabulary):
    workers = GrammarWorkers(vocabulary, timeout_s=600)

    async def run():
        slow = asyncio.ensure_future(workers.compile("regex", SLOW_REGEX))
        [pid] = await _started(workers, 1)
        await asyncio.sleep(1)  # compiling now
        slow.cancel()
        await asyncio.gather(slow, return_exceptions=True)
        assert _gone(pid, within_s=10)
        return await workers.compile("json", PERSON)

    try:
        assert asyncio.run(run()) is not None
    finally:
        workers.close()


def test_closing_does_not_wait_for_a_compile(vocabulary):
    workers = GrammarWorkers(vocabulary, timeout_s=600)

    async def run():
        slow = asyncio.ensure_future(workers.compile("regex", SLOW_REGEX))
        [pid] = await _started(workers, 1)
        await asyncio.sleep(1)
        started = time.monotonic()
        workers.close()
        with pytest.raises(EngineDeadError):
            await slow
        assert time.monotonic() - started < 10
        assert _gone(pid, within_s=10)

    asyncio.run(run())


UNGUARDED_SCRIPT = """
import asyncio, pathlib, sys
with open(sys.argv[1], "a") as runs:
    runs.write("ran\\n")  # a spawned child would run this again, as its own __main__
from transformers import AutoTokenizer
from pagoda.engine.structured_output.vocabulary import Vocabulary
from pagoda.engine.structured_output.workers import GrammarWorkers
tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
workers = GrammarWorkers(Vocabulary(tokenizer, len(tokenizer), [2]))
asyncio.run(workers.compile("json", '{"type": "object"}'))
workers.close()
print("compiled")
"""


def test_a_script_without_a_main_guard_compiles_and_is_not_run_again(tmp_path,
                                                                       tiny_model_folder):
    import subprocess
    import sys
    from pathlib import Path

    script, runs = tmp_path / "agent.py", tmp_path / "runs.txt"
    script.write_text(UNGUARDED_SCRIPT, encoding="utf-8")
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, str(script), str(runs), str(tiny_model_folder)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "compiled"
    assert runs.read_text() == "ran\n"  # the compile process did not run the user's script


def test_a_frozen_app_compiles_in_a_spawned_process(vocabulary, monkeypatch):
    # The PyInstaller bundle has no `python -c`: multiprocessing's spawn, which its
    # freeze_support answers, starts the process there.
    monkeypatch.setattr("pagoda.engine.structured_output.workers._uses_spawn", lambda: True)
    workers = GrammarWorkers(vocabulary)
    try:
        assert asyncio.run(workers.compile("json", PERSON)) is not None
    finally:
        workers.close()
