"""The config of a mixture-of-experts GGUF file from its own keys, as llama.cpp reads them: Qwen3-MoE
(`qwen3moe`), Qwen2-MoE (`qwen2moe`) and Mixtral (a `llama` file that states an expert count).

llama.cpp's converter writes the expert count, the experts used per token and the experts' width
(`expert_feed_forward_length`; Mixtral's is the plain `feed_forward_length`), never how the router
scores: llama.cpp fixes that per architecture (a softmax over all experts; the top k weights
renormalised to sum to 1 for Qwen3-MoE and Mixtral, kept as they are for Qwen2-MoE), whatever
`norm_topk_prob` the original config had. A file stating another scoring (`expert_gating_func`,
`expert_weights_norm`, `expert_weights_scale`, grouped experts) is refused, not run another way.
"""

from __future__ import annotations

from transformers import MixtralConfig, PretrainedConfig, Qwen2MoeConfig, Qwen3MoeConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.models.gguf_config import GGUFSettings, count, llama_shape, number, scaled_rope

# llama.cpp's LLAMA_MAX_EXPERTS. Each expert of each layer becomes three weights by name, so the
# product is bounded too: Qwen3-235B-A22B has 94 x 128 experts, DeepSeek-V3 61 x 256.
MAX_EXPERTS = 1024
MAX_EXPERT_MATRICES = 1 << 16  # layers x experts
_SOFTMAX = 1  # gguf's ExpertGatingFuncType


def qwen3moe_config(settings: GGUFSettings) -> PretrainedConfig:
    """Every layer sparse, its top k renormalised (llama.cpp's qwen3moe)."""
    experts = expert_settings(settings, renormalized=True)
    _refuse_shared_expert(settings)
    width = _expert_width(settings, experts["num_experts_per_tok"])
    shape = llama_shape(settings, intermediate=_dense_width(settings, width))
    return Qwen3MoeConfig(**shape, **experts, moe_intermediate_size=width,
                          rope_parameters=scaled_rope(settings), decoder_sparse_step=1,
                          mlp_only_layers=[])


def qwen2moe_config(settings: GGUFSettings) -> PretrainedConfig:
    """Every layer sparse with a shared expert behind a sigmoid gate, its top k weights as the
    softmax gave them (llama.cpp's qwen2moe)."""
    experts = expert_settings(settings, renormalized=False)
    width = _expert_width(settings, experts["num_experts_per_tok"])
    shape = llama_shape(settings, intermediate=_dense_width(settings, width))
    # llama.cpp's default where the file states none: the dense width
    shared = count(settings, "expert_shared_feed_forward_length", default=shape["intermediate_size"])
    return Qwen2MoeConfig(**shape, **experts, moe_intermediate_size=width,
                          shared_expert_intermediate_size=shared,
                          rope_parameters=scaled_rope(settings), decoder_sparse_step=1,
                          mlp_only_layers=[])


def mixtral_config(settings: GGUFSettings) -> PretrainedConfig:
    """A `llama` file with experts: every layer sparse, its experts feed_forward_length wide,
    its top k renormalised (llama.cpp's llama graph), no window."""
    experts = expert_settings(settings, renormalized=True)
    _refuse_shared_expert(settings)
    if settings.metadata(f"{settings.architecture}.expert_feed_forward_length") is not None:
        raise ModelLoadError(
            "The file states an expert width (llama.expert_feed_forward_length) beside its "
            "feed_forward_length, which llama.cpp's Mixtral files do not: its experts are "
            "feed_forward_length wide. Pagoda does not run this file.")
    return MixtralConfig(**llama_shape(settings), num_local_experts=experts["num_experts"],
                         num_experts_per_tok=experts["num_experts_per_tok"],
                         rope_parameters=scaled_rope(settings), sliding_window=None)


def has_experts(settings: GGUFSettings) -> bool:
    """Whether the file states experts (a Mixtral file says "llama" as a dense Llama does)."""
    return settings.metadata(f"{settings.architecture}.expert_count") not in (None, 0)


def expert_settings(settings: GGUFSettings, renormalized: bool) -> dict:
    """num_experts, num_experts_per_tok (each bounded) and norm_topk_prob; renormalized:
    whether the architecture's top k weights sum to 1 in llama.cpp."""
    experts = count(settings, "expert_count")
    used = count(settings, "expert_used_count")
    layers = count(settings, "block_count")
    if experts > MAX_EXPERTS or experts * layers > MAX_EXPERT_MATRICES:
        raise ModelLoadError(
            f"The file states {experts} experts in each of {layers} layers, more than Pagoda "
            f"reads ({MAX_EXPERTS} experts a layer, {MAX_EXPERT_MATRICES} in all). The file is "
            "damaged, or a model far larger than any released: choose another file.")
    if used > experts:
        raise ModelLoadError(
            f"The file routes each token to {used} of its {experts} experts "
            f"({settings.architecture}.expert_used_count): it cannot use more than it has. "
            "The file is damaged: re-download it.")
    _refuse_other_routing(settings, renormalized)
    return {"num_experts": experts, "num_experts_per_tok": used, "norm_topk_prob": renormalized}


def _expert_width(settings: GGUFSettings, used: int) -> int:
    """expert_feed_forward_length; where the file states none, llama.cpp's default: the dense
    width shared among the k experts a token uses."""
    if settings.metadata(f"{settings.architecture}.expert_feed_forward_length") is None:
        return max(1, count(settings, "feed_forward_length") // used)
    return count(settings, "expert_feed_forward_length")


def _dense_width(settings: GGUFSettings, expert_width: int) -> int:
    """The dense MLP width the converter wrote (the original intermediate_size), which no layer
    of such a file uses; the experts' where it wrote none."""
    return count(settings, "feed_forward_length", default=expert_width)


def _refuse_other_routing(settings: GGUFSettings, renormalized: bool) -> None:
    arch = settings.architecture
    gating = settings.metadata(f"{arch}.expert_gating_func")
    if gating not in (None, _SOFTMAX):
        raise ModelLoadError(
            f"The file scores its experts by gating function {gating!r} "
            f"({arch}.expert_gating_func), where {arch} models score them by a softmax (1) "
            "as llama.cpp runs them. Pagoda does not run this file.")
    norm = settings.metadata(f"{arch}.expert_weights_norm")
    if norm is not None and bool(norm) != renormalized:
        raise ModelLoadError(
            f"The file says its experts' weights are {'' if norm else 'not '}renormalised "
            f"({arch}.expert_weights_norm), where llama.cpp's {arch} "
            f"{'always' if renormalized else 'never'} renormalises them. Pagoda does not run "
            "this file.")
    if number(settings, "expert_weights_scale", 1.0) != 1.0:
        raise ModelLoadError(
            f"The file scales its experts' weights ({arch}.expert_weights_scale), which "
            f"llama.cpp's {arch} does not. Pagoda does not run this file.")
    if settings.metadata(f"{arch}.expert_group_count") is not None:
        raise ModelLoadError(
            f"The file routes tokens to groups of experts ({arch}.expert_group_count), which "
            f"{arch} models do not. Pagoda does not run this file.")


def _refuse_shared_expert(settings: GGUFSettings) -> None:
    if settings.tensor_dims("blk.0.ffn_gate_shexp.weight") is not None:
        raise ModelLoadError(
            f"The file holds a shared expert (blk.0.ffn_gate_shexp), which "
            f"{settings.architecture} models do not have (llama.cpp would not run it). Pagoda "
            "does not run this file.")
