"""The engine's command line: `python -m pagoda.engine chat`, `generate`, `serve` and `pull`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pagoda.engine.cli.chat import run_chat
from pagoda.engine.cli.common import add_common_options, add_model_options
from pagoda.engine.cli.generate import run_generate
from pagoda.engine.cli.pull import add_pull_options, run_pull
from pagoda.engine.cli.serve import add_serve_options, run_serve
from pagoda.engine.errors import PagodaError

logger = logging.getLogger(__name__)


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
    # Under `python -m pagoda.engine` argv[0] is this package's __main__.py, which makes a poor prog name.
    prog = "python -m pagoda.engine" if sys.argv[0].endswith("__main__.py") else None
    parser = argparse.ArgumentParser(prog=prog, description="Run Pagoda's inference engine.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    chat = commands.add_parser("chat", help="a streaming chat in the terminal",
                               description="Chat in the terminal. /reset clears the history, "
                                           "/exit or end of input quits; Ctrl-C stops a reply.")
    chat.add_argument("--system", help="a system prompt that opens the conversation")
    # Measured on the default 135M model: at 0.7 its first token is often "L" or "Al" (the top
    # choice has only ~25%) and replies drift into French; at 0.2 without a penalty they loop.
    add_common_options(chat, temperature=0.2, top_p=0.9, max_tokens=512,
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
    add_common_options(generate, temperature=0.0, top_p=1.0, max_tokens=256,
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
