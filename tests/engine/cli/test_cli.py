"""`python -m pagoda.engine` as a user runs it: a subprocess, with tiny replies.

Plain `generate` runs the default model, as a user who names none gets; the JSON and chat
tests are about the CLI's output and turns, so they run a 2-layer model folder given with
--model (the default model's start-up is ~25 s of each run)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SMALL = ["--max-tokens", "4", "--kv-cache-mb", "32"]


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pagoda.engine", *args], input=stdin, cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_generate_prints_the_completion():
    result = run_cli("generate", "The capital of France is", *SMALL)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


@pytest.mark.slow
def test_generate_json_prints_one_object_per_prompt(tiny_model_folder):
    prompts = ["The capital of France is", "Once upon a time"]

    result = run_cli("generate", "--json", *prompts, "--model", str(tiny_model_folder), *SMALL)

    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt"] for r in records] == prompts
    for record in records:
        assert record["text"]
        assert 1 <= record["num_tokens"] <= 4
        assert record["finish_reason"] in ("stop", "length")
        # One batch on a fresh engine: nothing is cached yet, and short prompts fill no block.
        assert record["num_cached_tokens"] == 0


@pytest.mark.slow
def test_piped_chat_answers_each_turn_and_continues_the_conversation(tiny_model_folder):
    result = run_cli("chat", "--temperature", "0", "--model", str(tiny_model_folder), *SMALL,
                     stdin="Hello\nWhat is your name?\n/exit\nnever sent\n")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    cached = [int(n) for n in re.findall(r"(\d+)/\d+ prompt tokens cached", result.stderr)]
    assert len(cached) == 2, "two turns answered, nothing after /exit"
    assert cached[1] > cached[0], "the second turn should reuse the first turn's prefix"


@pytest.mark.slow
def test_missing_model_path_is_reported_in_one_line():
    result = run_cli("generate", "hi", "--model", "/no/such/model.gguf")

    assert result.returncode == 2
    assert "/no/such/model.gguf" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_negative_temperature_is_rejected_by_name():
    result = run_cli("chat", "--temperature", "-1")

    assert result.returncode == 2
    assert "temperature" in result.stderr
    assert "Traceback" not in result.stderr


def test_speculative_tokens_option_reaches_the_engine_config():
    from pagoda.engine.cli.common import engine_options
    from pagoda.engine.cli.main import build_parser

    args = build_parser().parse_args(["generate", "hi", "--speculative-tokens", "4"])
    assert engine_options(args) == {"num_speculative_tokens": 4}


def test_a_gguf_models_vision_tower_reaches_the_engine_config():
    from pagoda.engine.cli.common import engine_options
    from pagoda.engine.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--model", "gemma-3-4b-it-Q4_K_M.gguf",
                                      "--mmproj", "mmproj-gemma-3-4b-it-f16.gguf"])
    assert engine_options(args) == {"mmproj": "mmproj-gemma-3-4b-it-f16.gguf"}


def test_the_vision_towers_dtype_reaches_the_engine_config():
    from pagoda.engine.cli.common import engine_options
    from pagoda.engine.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--model", "gemma-3-4b-it-Q4_K_M.gguf",
                                      "--vision-dtype", "float32"])
    assert engine_options(args) == {"vision_dtype": "float32"}


def test_a_vision_dtype_not_among_the_choices_is_refused():
    from pagoda.engine.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--vision-dtype", "int8"])
