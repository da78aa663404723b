"""`python -m pagoda.engine generate`: complete prompts as one batch and print them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pagoda.engine.cli.common import engine_options, require_chat_template, sampling_params
from pagoda.engine.llm import LLM
from pagoda.engine.outputs import RequestOutput


def run_generate(args: argparse.Namespace) -> int:
    prompts = _read_prompts(args)
    params = sampling_params(args)
    llm = LLM(args.model, **engine_options(args))
    if args.chat:
        require_chat_template(llm.tokenizer, args.model)
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
