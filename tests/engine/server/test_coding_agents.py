"""The real coding agents complete a turn headless against the server, a tool call and its result
included (the server forces the first call: `--force-tool-call`), every request they send
answered: OpenAI's Codex CLI (`codex exec`, the Responses API) and Anthropic's Claude Code
(`claude -p`, the Messages API), each through bench/coding_agents.py on the bundled model.

Slow (a minute or two each on 2 cores: Codex's first prompt is ~6.3k tokens) and skipped unless
PAGODA_AGENTS_NPM names a folder the two CLIs were installed under:

    npm install --prefix DIR @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
NPM_PREFIX = os.environ.get("PAGODA_AGENTS_NPM")
INSTALL = ("npm install --prefix DIR @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332, "
           "then PAGODA_AGENTS_NPM=DIR")


def _cli_or_skip(name: str) -> None:
    if not NPM_PREFIX:
        pytest.skip(f"PAGODA_AGENTS_NPM is not set: {INSTALL}")
    if not (Path(NPM_PREFIX) / "node_modules" / ".bin" / name).exists():
        pytest.skip(f"{name} is not installed under {NPM_PREFIX}: {INSTALL}")
    if name == "codex" and shutil.which("node") is None:
        pytest.skip("Codex CLI's launcher needs node, which is not on PATH")


@pytest.mark.parametrize(("agent", "cli"), [("codex", "codex"), ("claude", "claude")])
def test_a_coding_agent_runs_a_tool_and_completes_its_turn(agent, cli):
    _cli_or_skip(cli)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'bench'}"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "coding_agents.py"), "--agents", agent,
         "--npm-prefix", NPM_PREFIX, "--timeout", "400"],
        capture_output=True, text=True, timeout=480, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"## {agent}: PASS" in done.stdout
    assert "tool results sent back to the model: 0" not in done.stdout
