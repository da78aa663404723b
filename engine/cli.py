"""The engine's command line: `python -m engine chat`, `generate`, `serve` and `pull`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from engine.async_engine import AsyncEngine
from engine.chat_template import Message
from engine.config import KV_CACHE_DTYPES, QUANTIZATIONS, EngineConfig
from engine.errors import PagodaError, PromptTooLongError
from engine.hub_command import add_pull_options, run_pull
from engine.llm import LLM
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.server.command import add_serve_options, run_serve

logger = logging.getLogger(__name__)

_DIM, _RESET = "\x1b[2m", "\x1b[0m"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except (PagodaError, ValueError) as exc:
        logger.info("where the error came from", exc_info=True)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    # Under `python -m engine` argv[0] is this package's __main__.py, which makes a poor prog name.
    prog = "python -m engine" if sys.argv[0].endswith("__main__.py") else None
    parser = argparse.ArgumentParser(prog=prog, description="Run Pagoda's inference engine.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    chat = commands.add_parser("chat", help="a streaming chat in the terminal",
                               description="Chat in the terminal. /reset clears the history, "
                                           "/exit or end of input quits; Ctrl-C stops a reply.")
    chat.add_argument("--system", help="a system prompt that opens the conversation")
    # Measured on the default 135M model: at 0.7 its first token is often "L" or "Al" (the top
    # choice has only ~25%) and replies drift into French; at 0.2 without a penalty they loop.
    _add_common_options(chat, temperature=0.2, top_p=0.9, max_tokens=512,
                        repetition_penalty=1.1)
    chat.set_defaults(run=run_chat)

    generate = commands.add_parser("generate", help="complete prompts as one batch",
                                   description="Complete each prompt and print the results.")
    generate.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompts to complete")
    generate.add_argument("--file", type=Path,
                          help="read prompts from this file, one per line ('-' for stdin)")
    generate.add_argument("--chat", action="store_true",
                          help="wrap each prompt as a user message in the model's chat template")
    generate.add_argument("--json", action="store_true",
                          help="print one JSON object per prompt, one per line")
    _add_common_options(generate, temperature=0.0, top_p=1.0, max_tokens=256,
                        repetition_penalty=1.0)
    generate.set_defaults(run=run_generate)

    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP API on localhost",
                                description="Serve the model over OpenAI's API (/v1/chat/"
                                            "completions, /v1/completions, /v1/models), with "
                                            "/health and Prometheus /metrics.")
    add_model_options(serve)
    add_serve_options(serve)
    serve.set_defaults(run=run_serve)

    pull = commands.add_parser("pull", help="download a model from the Hugging Face Hub",
                               description="Download a GGUF file from a Hugging Face Hub "
                                           "repository into the models folder, check it against "
                                           "the Hub's SHA-256, and print its path. An interrupted "
                                           "download resumes where it stopped.")
    add_pull_options(pull)
    pull.set_defaults(run=run_pull)
    return parser


def _add_common_options(parser: argparse.ArgumentParser, *, temperature: float, top_p: float,
                        max_tokens: int, repetition_penalty: float) -> None:
    add_model_options(parser)
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=float, default=temperature,
                          help=f"0 is greedy (default: {temperature})")
    sampling.add_argument("--top-p", type=float, default=top_p, help=f"(default: {top_p})")
    sampling.add_argument("--top-k", type=int, default=-1, help="-1 disables it (default)")
    sampling.add_argument("--min-p", type=float, default=0.0, help="0 disables it (default)")
    sampling.add_argument("--repetition-penalty", type=float, default=repetition_penalty,
                          help=f"1 disables it (default: {repetition_penalty})")
    sampling.add_argument("--max-tokens", type=int, default=max_tokens,
                          help=f"the most tokens per reply (default: {max_tokens})")
    sampling.add_argument("--seed", type=int, help="make sampling reproducible")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Which model to load and how the engine holds it: shared by every command."""
    parser.add_argument("--model", metavar="PATH",
                        help="a Hugging Face model folder or a .gguf file "
                             "(default: the bundled SmolLM2-135M-Instruct)")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--device", default=None, metavar="DEVICE",
                        help="cpu or cuda (default: cpu)")
    engine.add_argument("--kv-cache-mb", type=_positive_int, metavar="MB",
                        help="memory for the KV cache (default: two full contexts of the model, "
                             "at most 1024 MB and a quarter of the memory available)")
    engine.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES,
                        help="what the KV cache keeps keys and values in (default: auto, the "
                             "compute dtype)")
    engine.add_argument("--max-num-seqs", type=_positive_int, metavar="N",
                        help="the most requests computed together (default: 64)")
    engine.add_argument("--speculative-tokens", type=int, metavar="K",
                        help="draft K tokens per step by prompt lookup (default: 0, off)")
    engine.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="how weights are kept: auto (a .gguf keeps its own quantization, a "
                             "folder loads as stored), none (all float), int8 or int4 "
                             "(quantized on load) (default: auto)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log progress (model conversion, loading)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                          max_tokens=args.max_tokens, seed=args.seed)


def engine_options(args: argparse.Namespace) -> dict[str, int | str]:
    """The EngineConfig fields set on the command line; the rest keep EngineConfig's defaults."""
    options = {}
    if args.device is not None:
        options["device"] = args.device
    if args.kv_cache_mb is not None:
        options["kv_cache_memory"] = args.kv_cache_mb << 20
    if args.kv_cache_dtype is not None:
        options["kv_cache_dtype"] = args.kv_cache_dtype
    if args.max_num_seqs is not None:
        options["max_num_seqs"] = args.max_num_seqs
    if args.speculative_tokens is not None:
        options["num_speculative_tokens"] = args.speculative_tokens
    if args.quantization is not None:
        options["quantization"] = args.quantization
    return options


def _require_chat_template(tokenizer, model: str | None) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the model {model or '(default)'} has no chat template: "
                         "use `generate` without --chat, or pick an instruction-tuned model")


def run_generate(args: argparse.Namespace) -> int:
    prompts = _read_prompts(args)
    params = sampling_params(args)
    llm = LLM(args.model, **engine_options(args))
    if args.chat:
        _require_chat_template(llm.tokenizer, args.model)
        conversations = [[{"role": "user", "content": p}] for p in prompts]
        outputs = llm.chat(conversations, params, use_tqdm=True)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=True)
    for prompt, out in zip(prompts, outputs, strict=True):
        print(_format_output(prompt, out, as_json=args.json), flush=True)
    return _report_failures(outputs)


def _read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompts)
    if args.file is not None:
        text = sys.stdin.read() if str(args.file) == "-" else _read_text(args.file)
        prompts += [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError("no prompts: pass them as arguments or with --file")
    return prompts


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the prompts file {path}: {exc.strerror}") from exc


def _format_output(prompt: str, out: RequestOutput, *, as_json: bool) -> str:
    completion = out.outputs[0]
    if not as_json:
        return completion.text
    return json.dumps({
        "prompt": prompt,
        "text": completion.text,
        "num_prompt_tokens": len(out.prompt_token_ids),
        "num_tokens": len(completion.token_ids),
        "finish_reason": completion.finish_reason,
        "num_cached_tokens": out.num_cached_tokens,
    }, ensure_ascii=False)


def _report_failures(outputs: list[RequestOutput]) -> int:
    failed = [out for out in outputs if out.outputs[0].finish_reason == "error"]
    for out in failed:
        print(f"error: request {out.request_id} failed: {out.outputs[0].error}", file=sys.stderr)
    return 1 if failed else 0


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
        _require_chat_template(engine.tokenizer, args.model)
        interactive = sys.stdin.isatty()
        if interactive:
            _enable_line_editing()
            _note(f"chatting with {engine.engine.loaded.name}: /reset clears the history, "
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
            _note("history cleared")
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
        _error(f"{exc} (/reset starts a new conversation)")
        return
    print(flush=True)
    error = reply.last.outputs[0].error if reply.last else None
    if error or not reply.text:
        history.pop()
    else:
        history.append({"role": "assistant", "content": reply.text})
    if error:
        _error(f"the reply failed: {error}")
    else:
        _note(_reply_stats(reply))


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


def _note(text: str) -> None:
    if sys.stderr.isatty():
        text = f"{_DIM}{text}{_RESET}"
    print(text, file=sys.stderr, flush=True)


def _error(text: str) -> None:
    print(f"error: {text}", file=sys.stderr, flush=True)
