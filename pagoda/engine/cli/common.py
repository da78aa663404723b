"""What every command line shares: the model and engine options, sampling, and how it speaks."""

from __future__ import annotations

import argparse
import sys

from pagoda.engine.config import KV_CACHE_DTYPES, QUANTIZATIONS, VISION_DTYPES
from pagoda.engine.sampling.fields import SAMPLING_FIELDS, sampling_values
from pagoda.engine.sampling.params import SamplingParams

_DIM, _RESET = "\x1b[2m", "\x1b[0m"


def add_common_options(parser: argparse.ArgumentParser, *, max_tokens: int,
                       **defaults: float) -> None:
    """The model's options and a flag per sampling field (pagoda.engine.sampling.fields), at
    its default there or at this command's in `defaults` (temperature=0.2)."""
    add_model_options(parser)
    sampling = parser.add_argument_group("sampling")
    for field in SAMPLING_FIELDS:
        default = defaults.pop(field.name, field.default)
        sampling.add_argument(field.flag, type=field.kind, default=default,
                              help=f"{field.help.rstrip('.')} (default: {default:g})")
    assert not defaults, f"no sampling fields {sorted(defaults)}"
    sampling.add_argument("--max-tokens", type=int, default=max_tokens,
                          help=f"the most tokens per reply (default: {max_tokens})")
    sampling.add_argument("--seed", type=int, help="make sampling reproducible")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Which model to load and how the engine holds it: shared by every command."""
    parser.add_argument("--model", metavar="PATH",
                        help="a Hugging Face model folder or a .gguf file "
                             "(default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--mmproj", metavar="PATH",
                        help="a .gguf model's vision tower (the mmproj-*.gguf file published "
                             "beside it): its chats take images")
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
    engine.add_argument("--vision-dtype", choices=VISION_DTYPES,
                        help="what the vision tower (--mmproj, or a folder's own) computes in "
                             "(default: auto, bfloat16 on a CPU with AVX512-BF16 or AMX, "
                             "float32 on other CPUs)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log progress (model conversion, loading)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(**sampling_values(args), max_tokens=args.max_tokens, seed=args.seed)


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
    if args.mmproj is not None:
        options["mmproj"] = args.mmproj
    if args.vision_dtype is not None:
        options["vision_dtype"] = args.vision_dtype
    return options


def require_chat_template(tokenizer, model: str | None) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the model {model or '(default)'} has no chat template: "
                         "use `generate` without --chat, or pick an instruction-tuned model")


def note(text: str) -> None:
    if sys.stderr.isatty():
        text = f"{_DIM}{text}{_RESET}"
    print(text, file=sys.stderr, flush=True)


def error(text: str) -> None:
    print(f"error: {text}", file=sys.stderr, flush=True)
