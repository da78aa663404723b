"""The Llama family: Llama 2/3, SmolLM/SmolLM2, Mistral, Qwen2/2.5 (q/k/v bias) and Qwen3
(per-head q/k norms). Every layer is a Llama layer, so the one-C-call decode step runs them.
The mixtures of experts built on these layers (pagoda/engine/models/qwen3_moe.py, mixtral.py) take
their attention from here."""

from __future__ import annotations

from transformers import PretrainedConfig

from pagoda.engine.layers.rotary import rope_spec
from pagoda.engine.models import text_model_folders
from pagoda.engine.models.architecture import AttentionKind, DecoderArchitecture, LayerNames
from pagoda.engine.models.config import head_dim, model_shape
from pagoda.engine.models.gguf_config import GGUFSettings
from pagoda.engine.models.moe_gguf import has_experts, mixtral_config

NAME = "Llama"  # its entry in pagoda/engine/models/registry.py names the model types it covers
_QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe"})
# A multimodal folder's text model's tensors (pagoda/engine/models/text_model_folders.py).
FOLDER_TENSORS = text_model_folders.FOLDER_TENSORS
folder_weights = text_model_folders.folder_weights


def architecture(config: PretrainedConfig) -> DecoderArchitecture:
    shape = model_shape(config)
    qk_norm = config.model_type in _QK_NORM_TYPES
    qkv_bias, o_bias = _attention_biases(config)
    return DecoderArchitecture(
        family=NAME, shape=shape,
        layers=tuple(AttentionKind(window) for window in shape.layer_windows),
        ropes={"default": rope_spec(config, head_dim(config))},
        names=LayerNames(q_norm="self_attn.q_norm" if qk_norm else None,
                         k_norm="self_attn.k_norm" if qk_norm else None),
        tied_embeddings=bool(config.tie_word_embeddings), qkv_bias=qkv_bias, o_bias=o_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)))


def config_from_gguf(settings: GGUFSettings) -> PretrainedConfig | None:
    """A "llama" file that states experts is a Mixtral (its config from the file's keys, as
    llama.cpp reads them); others are read by transformers' GGUF reader (None)."""
    return mixtral_config(settings) if has_experts(settings) else None


def _attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
    """(q/k/v have a bias, o_proj has a bias), as Hugging Face's modelling code builds them."""
    if config.model_type == "qwen2":
        return True, False
    if config.model_type == "qwen2_moe":
        return bool(config.qkv_bias), False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias
