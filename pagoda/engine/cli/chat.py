"""`python -m pagoda.engine chat`: a streaming chat in the terminal."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass

from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.cli.common import engine_options, error, note, require_chat_template, sampling_params
from pagoda.engine.config import EngineConfig
from pagoda.engine.errors import PromptTooLongError
from pagoda.engine.outputs import RequestOutput
from pagoda.engine.sampling.params import SamplingParams
from pagoda.engine.text.chat_template import Message


@dataclass(slots=True)
class _Reply:
    """What one streamed reply has produced so far; survives a Ctrl-C."""

    text: str = ""
    last: RequestOutput | None = None
    interrupted: bool = False


def run_chat(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    engine = AsyncEngine(args.model, EngineConfig(**engine_options(args)))
    try:
        require_chat_template(engine.tokenizer, args.model)
        interactive = sys.stdin.isatty()
        if interactive:
            _enable_line_editing()
            note(f"chatting with {engine.model_name}: /reset clears the history, "
                  "/exit quits, Ctrl-C stops a reply")
        with asyncio.Runner() as runner:
            _chat_loop(engine, runner, params, args.system, prompt="> " if interactive else "")
    finally:
        engine.shutdown()
    return 0


def _chat_loop(engine: AsyncEngine, runner: asyncio.Runner, params: SamplingParams,
               system: str | None, prompt: str) -> None:
    opening: list[Message] = [{"role": "system", "content": system}] if system else []
    history: list[Message] = []
    while (line := _read_line(prompt)) is not None:
        command = line.strip()
        if command == "/exit":
            return
        if command == "/reset":
            history.clear()
            note("history cleared")
        elif command:
            history.append({"role": "user", "content": line})
            _take_turn(engine, runner, params, opening + history, history)


def _read_line(prompt: str) -> str | None:
    """The next line typed, or None at end of input or Ctrl-C."""
    try:
        return input(prompt)
    except EOFError:
        return None
    except KeyboardInterrupt:
        print()
        return None


def _take_turn(engine: AsyncEngine, runner: asyncio.Runner, params: SamplingParams,
               messages: list[Message], history: list[Message]) -> None:
    """Stream one reply and record it in history; a failed turn leaves history as it was."""
    reply = _Reply()
    try:
        runner.run(_stream_reply(engine, messages, params, reply))
    except KeyboardInterrupt:
        reply.interrupted = True
    except PromptTooLongError as exc:
        history.pop()
        error(f"{exc} (/reset starts a new conversation)")
        return
    print(flush=True)
    failure = reply.last.outputs[0].error if reply.last else None
    if failure or not reply.text:
        history.pop()
    else:
        history.append({"role": "assistant", "content": reply.text})
    if failure:
        error(f"the reply failed: {failure}")
    else:
        note(_reply_stats(reply))


async def _stream_reply(engine: AsyncEngine, messages: list[Message], params: SamplingParams,
                        reply: _Reply) -> None:
    async for out in engine.stream(messages, params):
        reply.last = out
        reply.text = out.outputs[0].text
        if out.outputs[0].delta_text:
            sys.stdout.write(out.outputs[0].delta_text)
            sys.stdout.flush()


def _reply_stats(reply: _Reply) -> str:
    """One line: tokens, decode speed, time to first token, prompt tokens served from cache."""
    if reply.last is None:
        return "interrupted before the first token"
    out, metrics = reply.last, reply.last.metrics
    num_tokens = len(out.outputs[0].token_ids)
    parts = [f"{num_tokens} tokens"]
    end = metrics.finished_time or time.monotonic()
    if metrics.first_token_time is not None and num_tokens > 1 and end > metrics.first_token_time:
        parts.append(f"{(num_tokens - 1) / (end - metrics.first_token_time):.1f} tok/s")
    if metrics.time_to_first_token is not None:
        parts.append(f"TTFT {metrics.time_to_first_token * 1000:.0f} ms")
    parts.append(f"{out.num_cached_tokens}/{len(out.prompt_token_ids)} prompt tokens cached")
    if reply.interrupted:
        parts.append("interrupted")
    return ", ".join(parts)


def _enable_line_editing() -> None:
    with contextlib.suppress(ImportError):  # no readline on Windows
        import readline  # noqa: F401 - importing it gives input() history and line editing
