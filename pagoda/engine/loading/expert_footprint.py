"""A mixture-of-experts model's size twice over: the total (every expert, on disk and memory-mapped)
and the active part a token reads (the layers every token runs, plus top_k of each sparse layer's
E experts). Qwen3-30B-A3B holds 30.5B parameters and reads 3.3B a token: the total must fit in
RAM for the experts to be read from memory rather than the disk, the active bytes set how fast it
decodes.

Which tensors are routed experts is told by their names, whatever the family: a GGUF file's
`blk.N.ffn_{gate,up,down}_exps` (3-D, one matrix per expert, with their biases where gpt-oss has
them), a Hugging Face folder's `....experts....` (per-expert matrices, or gpt-oss's and
transformers 5's fused 3-D ones). A shared expert (`ffn_*_shexp`, `mlp.shared_expert.`) and the
router run for every token: they are not routed. How many experts there are and how many a token
uses come from the file's keys or config.json.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.models.moe_gguf import MAX_EXPERTS

# config.json's names for the number of routed experts and for top_k, by family: Qwen2/3-MoE,
# Mixtral and gpt-oss, DeepSeek; every one of them says top_k as num_experts_per_tok (gpt-oss
# also as experts_per_token).
_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_EXPERTS_USED_KEYS = ("num_experts_per_tok", "experts_per_token")


@dataclass(slots=True, frozen=True)
class ExpertRouting:
    """num_experts routed experts in each sparse layer, num_used of them read per token."""

    num_experts: int
    num_used: int

    @property
    def active_share(self) -> float:
        """The share of a sparse layer's expert weights one token reads."""
        return self.num_used / self.num_experts


# Granite's released folders keep a layer's experts in two 3-D tensors of these names.
_GRANITE_EXPERTS = (".block_sparse_moe.input_linear.", ".block_sparse_moe.output_linear.")


def is_expert_tensor(name: str) -> bool:
    """Whether a tensor (a GGUF or a Hugging Face name) holds routed experts' weights."""
    return "_exps." in name or ".experts." in name or any(g in name for g in _GRANITE_EXPERTS)


def routing_from_config(config: Mapping[str, object], where: str) -> ExpertRouting | None:
    """The routing config.json states (as parsed; `where` names it in errors); None for a dense
    model, which states no number of experts."""
    experts = _first_present(config, _EXPERT_COUNT_KEYS)
    used = _first_present(config, _EXPERTS_USED_KEYS)
    if experts is None or experts == 0:
        return None
    return checked_routing(experts, used, where, f"{_EXPERT_COUNT_KEYS[0]} (or "
                           f"{', '.join(_EXPERT_COUNT_KEYS[1:])})", _EXPERTS_USED_KEYS[0])


def routing_from_gguf(metadata: Callable[[str], object], architecture: str,
                      where: str) -> ExpertRouting | None:
    """The routing a GGUF file's keys state (`{arch}.expert_count`, `{arch}.expert_used_count`,
    as llama.cpp writes them); None for a dense model."""
    count_key, used_key = f"{architecture}.expert_count", f"{architecture}.expert_used_count"
    experts = metadata(count_key)
    if experts is None or experts == 0:
        return None
    return checked_routing(experts, metadata(used_key), where, count_key, used_key)


def checked_routing(experts: object, used: object, where: str, count_key: str,
                    used_key: str) -> ExpertRouting:
    """Refuse counts no model has (ModelLoadError naming the keys), before anything is sized
    by them."""
    if used is None:
        raise ModelLoadError(
            f"{where} states {experts} experts but not how many a token uses ({used_key}). "
            "The file is incomplete or damaged: re-download it.")
    if not (_is_count(experts) and _is_count(used) and 1 <= used <= experts <= MAX_EXPERTS):
        raise ModelLoadError(
            f"{where} states {count_key} = {experts!r} and {used_key} = {used!r}: a model "
            f"routes each token to between 1 and all of at most {MAX_EXPERTS} experts. The file "
            "is damaged: re-download it.")
    return ExpertRouting(int(experts), int(used))


def _first_present(config: Mapping[str, object], keys: tuple[str, ...]) -> object:
    return next((config[key] for key in keys if config.get(key) is not None), None)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def expert_parameters(config: Mapping[str, object], routing: ExpertRouting) -> int:
    """The routed experts' parameters from config.json's widths, for a count that has no tensor
    headers to add up (a repository on the Hub): each sparse layer's E experts of gate, up and
    down matrices. Layers are sparse as Qwen-MoE's decoder_sparse_step and mlp_only_layers say
    (by default, all)."""
    hidden = config.get("hidden_size")
    width = config.get("moe_intermediate_size") or config.get("intermediate_size")
    layers = config.get("num_hidden_layers")
    step = config.get("decoder_sparse_step") or 1
    dense = config.get("mlp_only_layers") or []
    if not all(_is_count(n) and n > 0 for n in (hidden, width, layers, step)) \
            or not isinstance(dense, list):
        return 0
    # Counted without a loop over the layers: the count comes from a file we do not trust.
    sparse = layers // step - len({i for i in dense
                                   if _is_count(i) and 0 <= i < layers and (i + 1) % step == 0})
    return sparse * routing.num_experts * 3 * hidden * width
