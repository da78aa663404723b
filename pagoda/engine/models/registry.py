"""Which model families Pagoda runs: each family module (pagoda/engine/models/<family>.py) is found here
by Hugging Face's `model_type` and by a GGUF file's `general.architecture`.

Families the engine does not run yet are named too, with the reason, so that a user who picks
such a file, or finds it on the Hub, reads why instead of a bare "unsupported".
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagoda.engine.errors import ModelLoadError

if TYPE_CHECKING:  # the table itself imports neither torch nor transformers (the Hub search reads it)
    from transformers import PretrainedConfig

    from pagoda.engine.models.architecture import DecoderArchitecture, ModelShape
    from pagoda.engine.models.gguf_config import GGUFSettings


@dataclass(frozen=True, slots=True)
class ModelFamily:
    name: str  # as users know it: "Gemma 3"
    module: str  # pagoda.engine.models.<module> defines NAME and architecture(config)
    model_types: tuple[str, ...]  # config.json's model_type
    gguf_architectures: tuple[str, ...]  # a GGUF file's general.architecture
    examples: str  # the models it covers, for messages

    def architecture(self, config: PretrainedConfig) -> DecoderArchitecture:
        return importlib.import_module(f"pagoda.engine.models.{self.module}").architecture(config)

    def config_from_gguf(self, settings: GGUFSettings) -> PretrainedConfig | None:
        """A GGUF file's config built from its keys by the family's module, where it defines
        config_from_gguf (transformers' GGUF reader does not read it, or not whole); else None."""
        module = importlib.import_module(f"pagoda.engine.models.{self.module}")
        build = getattr(module, "config_from_gguf", None)
        return None if build is None else build(settings)

    def folder_tensor_pattern(self) -> re.Pattern | None:
        """The folder tensors the family's module maps to the shared names itself
        (FOLDER_TENSORS: gpt-oss's fused experts), or None where a folder's names are those."""
        return getattr(importlib.import_module(f"pagoda.engine.models.{self.module}"),
                       "FOLDER_TENSORS", None)

    def folder_weights(self, config: PretrainedConfig, tensors: dict) -> dict:
        """Those tensors (`folder_tensor_pattern`'s) under the shared names."""
        return importlib.import_module(f"pagoda.engine.models.{self.module}").folder_weights(config,
                                                                                     tensors)


FAMILIES: tuple[ModelFamily, ...] = (
    # Mistral's GGUF files say "llama".
    # And SmolVLM's multimodal folders (a Llama text model beside its image tower; SmolVLM2's
    # "smolvlm", the first SmolVLMs' "idefics3"), whose GGUF files hold the text model alone
    # under "llama".
    ModelFamily("Llama", "llama", ("llama", "mistral", "qwen2", "qwen3", "smolvlm", "idefics3"),
                ("llama", "qwen2", "qwen3"), "Llama 2/3, SmolLM/SmolLM2, Mistral, Qwen2/2.5, Qwen3"),
    ModelFamily("Gemma 2", "gemma2", ("gemma2",), ("gemma2",), "Gemma 2 2B, 9B, 27B"),
    # Text folders, and the multimodal folders Gemma 3 4B and larger are released as (its text
    # model and its image tower); its GGUF files hold the text model alone under "gemma3".
    ModelFamily("Gemma 3", "gemma3", ("gemma3_text", "gemma3"), ("gemma3",),
                "Gemma 3: 270M and 1B text folders, 4B and larger with images, every size as GGUF"),
    # Dense Gemma 4 text models; a multimodal "gemma4" folder is refused below, and the family
    # refuses mixture-of-experts layers itself.
    ModelFamily("Gemma 4", "gemma4", ("gemma4_text",), ("gemma4",),
                "Gemma 4 dense text models: E2B, E4B, 31B"),
    ModelFamily("Phi-3", "phi3", ("phi3",), ("phi3",), "Phi-3/3.5-mini, Phi-4-mini"),
    ModelFamily("SmolLM3", "smollm3", ("smollm3",), ("smollm3",), "SmolLM3"),
    ModelFamily("gpt-oss", "gpt_oss", ("gpt_oss",), ("gpt-oss",), "gpt-oss-20b, gpt-oss-120b"),
    ModelFamily("Qwen3-MoE", "qwen3_moe", ("qwen3_moe", "qwen2_moe"), ("qwen3moe", "qwen2moe"),
                "Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen1.5-MoE, Qwen2-57B-A14B"),
    ModelFamily("Mixtral", "mixtral", ("mixtral",), (), "Mixtral 8x7B, 8x22B"),
    ModelFamily("LFM2", "lfm2", ("lfm2",), ("lfm2",), "LFM2-350M, 700M, 1.2B, 2.6B"),
    ModelFamily("Granite 4 hybrid", "granitemoehybrid", ("granitemoehybrid",), ("granitehybrid",),
                "Granite-4.0-H-Micro, H-Tiny, H-Small"),
    # Text folders (Qwen3_5ForCausalLM), and the multimodal folders Qwen3.5 is released as
    # ("qwen3_5": their text model, TEXT_MODEL_OF).
    ModelFamily("Qwen3.5", "qwen3_5", ("qwen3_5_text", "qwen3_5"), ("qwen35",),
                "Qwen3.5 dense: folders (text), every size as GGUF"),
    ModelFamily("Qwen3-Next", "qwen3_next", ("qwen3_next",), ("qwen3next",),
                "Qwen3-Next-80B-A3B"),
    # Text folders, and the multimodal folders it is released as (their text model).
    ModelFamily("Qwen3.5-MoE", "qwen3_5_moe", ("qwen3_5_moe_text", "qwen3_5_moe"), ("qwen35moe",),
                "Qwen3.5 mixture-of-experts (35B-A3B and larger): text folders, GGUF"),
    # Its multimodal folders (their text model and image tower), and llama.cpp's qwen2vl files
    # (the text model; the tower is the mmproj file beside them).
    ModelFamily("Qwen2.5-VL", "qwen2_5_vl", ("qwen2_5_vl_text", "qwen2_5_vl"), ("qwen2vl",),
                "Qwen2.5-VL 3B, 7B, 32B, 72B with images: folders, and GGUF with its mmproj"),
)

# Known families the engine does not run yet: the reason shown in words.
MIXTURE_OF_EXPERTS = "mixture-of-experts: not yet"
_HYBRID = "hybrid attention and state-space layers: not yet"
_VISION = "vision-language model: not yet"
NOT_YET: dict[str, str] = {
    **dict.fromkeys(("deepseek_v2", "deepseek2", "deepseek_v3", "olmoe",
                     "granitemoe", "phimoe", "llama4", "dbrx", "glm4_moe", "glm4moe"),
                    MIXTURE_OF_EXPERTS),
    **dict.fromkeys(("mamba", "mamba2", "jamba", "falcon_h1", "falcon-h1",
                     "nemotron_h", "nemotron_h_moe", "rwkv6", "rwkv7"),
                    _HYBRID),
    **dict.fromkeys(("qwen2_vl", "qwen25vl", "qwen3_vl", "qwen3vl",
                     "mistral3", "llava", "mllama", "gemma3n", "gemma4"),
                    _VISION),
}


# Multimodal folders whose text model Pagoda runs: model_type -> the config's attribute that holds
# the text model's config (its weights: the family's FOLDER_TENSORS).
TEXT_MODEL_OF = {"qwen3_5": "text_config", "qwen3_5_moe": "text_config", "gemma3": "text_config",
                 "smolvlm": "text_config", "idefics3": "text_config", "qwen2_5_vl": "text_config"}


def text_model_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config of the model Pagoda runs: a multimodal folder's text model's, else config."""
    key = TEXT_MODEL_OF.get(config.model_type)
    if key is None:
        return config
    text = getattr(config, key)
    if not hasattr(text, "tie_word_embeddings"):
        # transformers 5 keeps it on the whole config only (Qwen2.5-VL's).
        text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    return text


def family_for_model_type(model_type: str | None) -> ModelFamily | None:
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def family_for_gguf(architecture: str | None) -> ModelFamily | None:
    return next((f for f in FAMILIES if architecture in f.gguf_architectures), None)


def supported_model_types() -> frozenset[str]:
    return frozenset(t for f in FAMILIES for t in f.model_types)


def supported_gguf_architectures() -> frozenset[str]:
    return frozenset(a for f in FAMILIES for a in f.gguf_architectures)


def why_not_supported(name: str | None) -> str:
    """The reason a model_type or GGUF architecture does not run, in words."""
    if name in NOT_YET:
        return NOT_YET[name]
    return "not a model family Pagoda knows"


def unsupported_message(name: str | None, where: str) -> str:
    runs = "; ".join(f"{f.name} ({f.examples})" for f in FAMILIES)
    return (f"Unsupported architecture {name!r} in {where} ({why_not_supported(name)}). "
            f"Pagoda runs these families: {runs}.")


def architecture_of(config: PretrainedConfig) -> DecoderArchitecture:
    family = family_for_model_type(config.model_type)
    if family is None:
        raise ModelLoadError(unsupported_message(config.model_type, "config.json"))
    return family.architecture(config)


def header_shape(config: PretrainedConfig) -> ModelShape:
    """A model's shape as its config states it, for the checks made before a load: the family's
    own where the model has recurrent layers (only the family knows their states' size), else
    what every family reads alike."""
    from pagoda.engine.models.config import model_shape

    shape = model_shape(config)
    return architecture_of(config).shape if shape.recurrent_layers else shape


def optional_weight_shapes(config: PretrainedConfig) -> dict[str, tuple[int, ...]]:
    """Parameters a model's files may carry beside those it needs (a multi-token-prediction
    block), by Hugging Face name, with their shapes: read where all are there."""
    from pagoda.engine.models.config import mtp_block_shapes

    return mtp_block_shapes(architecture_of(config))


def expected_weight_shapes(config: PretrainedConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter the model needs, by Hugging Face name, with its shape."""
    from pagoda.engine.models.config import weight_shapes

    return weight_shapes(architecture_of(config))
