"""A Llama-shaped model's config read from a GGUF file's own metadata keys, for the families whose
files transformers' GGUF reader does not read (SmolLM3) or reads with settings left at its class
defaults (Phi-3: partial rotary, the trained context, longrope, the window). The family module
(pagoda/engine/models/<family>.py) adds its own keys to these and builds its config class.
"""

from __future__ import annotations

from typing import Protocol

from pagoda.engine.errors import ModelLoadError


class GGUFSettings(Protocol):
    """What a family reads from a GGUF file to build its config (pagoda.engine.loading.gguf.GGUFModelFile)."""

    architecture: str

    def metadata(self, key: str) -> object:
        """A metadata key's value (a list for an array), or None where the file lacks it."""

    def tensor_dims(self, name: str) -> tuple[int, ...] | None:
        """A tensor's shape, outermost first ([vocab, hidden] for token_embd), or None."""

    def small_vector(self, name: str, length: int) -> list[float] | None:
        """A float tensor of exactly `length` values (llama.cpp keeps some settings as tensors),
        or None where the file lacks it."""


def count(settings: GGUFSettings, key: str, default: int | None = None) -> int:
    """A positive whole number the file states under `<architecture>.<key>`."""
    value = settings.metadata(f"{settings.architecture}.{key}")
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        stated = "nothing" if value is None else repr(value)
        raise ModelLoadError(
            f"The file states {stated} for {settings.architecture}.{key}, where a positive whole "
            "number is needed. The file is damaged: re-download it.")
    return value


def number(settings: GGUFSettings, key: str, default: float) -> float:
    value = settings.metadata(f"{settings.architecture}.{key}")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ModelLoadError(
            f"The file states {value!r} for {settings.architecture}.{key}, where a positive "
            "number is needed. The file is damaged: re-download it.")
    return float(value)


def layer_counts(settings: GGUFSettings, key: str, layers: int) -> list[int]:
    """A positive whole number per layer: the file's list of one per layer, or one for all."""
    values = settings.metadata(f"{settings.architecture}.{key}")
    if not isinstance(values, list):
        return [count(settings, key)] * layers
    if len(values) != layers or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                    for v in values):
        raise ModelLoadError(
            f"The file states {len(values)} values for {settings.architecture}.{key}, where a "
            f"positive whole number for each of its {layers} layers is needed. The file is "
            "damaged: re-download it.")
    return values


def hybrid_kv_heads(settings: GGUFSettings, recurrent: str) -> list[int]:
    """A hybrid file's attention layers, as llama.cpp's converter states them: each layer's
    key-value heads (attention.head_count_kv, a list), 0 for a `recurrent` layer (LFM2's
    convolutions, Granite's Mamba layers), one same count for every attention layer."""
    layers = count(settings, "block_count")
    kv_heads = settings.metadata(f"{settings.architecture}.attention.head_count_kv")
    if (not isinstance(kv_heads, list) or len(kv_heads) != layers
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in kv_heads)
            or len(set(kv_heads) - {0}) != 1):
        raise ModelLoadError(
            f"The file states {kv_heads!r} for {settings.architecture}.attention.head_count_kv, "
            f"where a {settings.architecture} file lists each of its {layers} layers' key-value "
            f"heads: 0 for a {recurrent}, one same count for every attention layer. The file "
            "is damaged: re-download it.")
    return kv_heads


def llama_shape(settings: GGUFSettings, kv_heads: int | None = None,
                intermediate: int | None = None) -> dict:
    """The config fields every Llama-shaped file states the same way: sizes, RoPE base, norm
    epsilon, a tied or separate output matrix, and the special tokens. kv_heads, intermediate:
    where the file states them per layer (`layer_counts`), the family's choice."""
    hidden = count(settings, "embedding_length")
    heads = count(settings, "attention.head_count")
    kv_heads = kv_heads or count(settings, "attention.head_count_kv", default=heads)
    if hidden % heads or heads % kv_heads:
        raise ModelLoadError(
            f"The file states {heads} attention heads over {kv_heads} key-value heads for a "
            f"width of {hidden}: the heads must divide the width and the key-value heads the "
            "heads. The file is damaged: re-download it.")
    embedding = settings.tensor_dims("token_embd.weight")
    if embedding is None or len(embedding) != 2:
        raise ModelLoadError("The file has no token_embd.weight matrix, which every model needs. "
                             "The file is incomplete: re-download it.")
    shape = {
        "num_hidden_layers": count(settings, "block_count"),
        "hidden_size": hidden,
        "intermediate_size": intermediate or count(settings, "feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": count(settings, "context_length"),
        "rms_norm_eps": number(settings, "attention.layer_norm_rms_epsilon", 1e-5),
        "vocab_size": embedding[0],
        "tie_word_embeddings": settings.tensor_dims("output.weight") is None,
        **_special_tokens(settings),
    }
    shape["head_dim"] = count(settings, "attention.key_length", default=hidden // heads)
    return shape


def rope_theta(settings: GGUFSettings) -> float:
    return number(settings, "rope.freq_base", 10000.0)


def scaled_rope(settings: GGUFSettings) -> dict:
    """The rope parameters of a file from llama.cpp's Llama-path converter, which writes linear
    and YaRN scaling as keys (rope.scaling.*) and Llama 3's as a rope_freqs tensor."""
    rope = {"rope_type": "default", "rope_theta": rope_theta(settings)}
    kind = settings.metadata(f"{settings.architecture}.rope.scaling.type")
    if settings.tensor_dims("rope_freqs.weight") is not None or kind not in (None, "none",
                                                                             "linear", "yarn"):
        scaling = "a rope_freqs tensor" if kind in (None, "none") else repr(kind)
        raise ModelLoadError(
            f"The file scales RoPE by {scaling}, which Pagoda does not read from a "
            f"{settings.architecture} GGUF file (it reads linear and YaRN scaling).")
    if kind in (None, "none"):
        return rope
    rope |= {"rope_type": kind, "factor": number(settings, "rope.scaling.factor", 1.0)}
    if kind == "yarn":
        rope["original_max_position_embeddings"] = count(
            settings, "rope.scaling.original_context_length")
        for key, name in (("yarn_attn_factor", "attention_factor"),
                          ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if settings.metadata(f"{settings.architecture}.rope.scaling.{key}") is not None:
                rope[name] = number(settings, f"rope.scaling.{key}", 1.0)
        if number(settings, "rope.scaling.yarn_ext_factor", 1.0) != 1.0:
            raise ModelLoadError(
                "The file sets YaRN's extrapolation factor (rope.scaling.yarn_ext_factor), "
                "which transformers' YaRN, the reference Pagoda follows, does not have.")
    return rope


def rotary_dims(settings: GGUFSettings, head_dim: int) -> int:
    """How many of each head's dimensions rotate (rope.dimension_count; all where absent)."""
    dims = count(settings, "rope.dimension_count", default=head_dim)
    if dims % 2 or dims > head_dim:
        raise ModelLoadError(
            f"The file rotates {dims} of each head's {head_dim} dimensions "
            f"({settings.architecture}.rope.dimension_count): an even count up to the head size "
            "is needed. The file is damaged: re-download it.")
    return dims


def _special_tokens(settings: GGUFSettings) -> dict:
    tokens = {}
    for field in ("bos", "eos", "padding"):
        value = settings.metadata(f"tokenizer.ggml.{field}_token_id")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelLoadError(f"The file states {value!r} for tokenizer.ggml.{field}_token_id, "
                                 "where a token id is needed. The file is damaged: re-download it.")
        tokens["pad_token_id" if field == "padding" else f"{field}_token_id"] = value
    return tokens
