"""A vision tower from an `mmproj` GGUF file, as llama.cpp's converter writes one beside a
multimodal model's language model (`convert_hf_to_gguf.py --mmproj`): architecture "clip", the
tower's sizes under clip.vision.*, its tensors under v.* and the projector's under mm.*.

The tensors are read under the names of transformers' own modules
(pagoda/engine/models/vision_tower.py builds the tower from them), in float32: the tower's
matrices are few and its work is a prefill's (thousands of patches), where PyTorch's GEMMs are
the fast path. Three projector types are read (`MMProjFile.multimodal_config`): Gemma 3's
("gemma3"), SmolVLM's ("idefics3": its pixel-shuffle connector, and its processor's longest
edge, clip.vision.preproc_image_size) and Qwen2.5-VL's ("qwen2.5vl_merger"). The converter
writes Qwen's tower with q, k and v apart (fused again here), its 3-D patch kernel as two 2-D
ones, one a frame (stacked again), its full-attention layers as a period
(clip.vision.n_wa_pattern: every n-th layer), and no window size, which llama.cpp's mtmd takes
as 112 pixels, Qwen's own.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import transformers

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.loading.gguf import (
    dequantize_to_float,
    open_gguf_reader,
    squeezed_shape,
    tensor_shape,
)
from pagoda.engine.loading.tile_settings import tile_settings
from pagoda.engine.models.vision_tower import CLIP_MEAN, CLIP_STD, PROJECTOR, TOWER, VISUAL

GEMMA3 = "gemma3"
IDEFICS3 = "idefics3"  # SmolVLM's
QWEN2_5_VL = "qwen2.5vl_merger"
PROJECTOR_TYPES = (GEMMA3, IDEFICS3, QWEN2_5_VL)
# llama.cpp's older idefics3 files state no longest edge: transformers' SmolVLM processors
# resize to four tiles' width (SmolVLM-256M: 2,048 for tiles of 512).
_DEFAULT_TILES_PER_EDGE = 4
# What the converter does not write of Qwen2.5-VL's tower, as llama.cpp's mtmd reads it.
QWEN_WINDOW_SIZE = 112
QWEN_MERGE_SIZE = 2
# Bounds on what the header may claim before a config is built from it: the largest released
# towers (SigLIP-so400m: 27 layers of 1,152) are far inside them.
MAX_LAYERS = 128
MAX_WIDTH = 16_384

_LAYER = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)")
_LAYER_NAMES = {"ln1": "layer_norm1", "ln2": "layer_norm2", "attn_q": "self_attn.q_proj",
                "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_out": "self_attn.out_proj", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"}
_GLOBAL_NAMES = {
    "v.patch_embd.weight": TOWER + "embeddings.patch_embedding.weight",
    "v.patch_embd.bias": TOWER + "embeddings.patch_embedding.bias",
    "v.position_embd.weight": TOWER + "embeddings.position_embedding.weight",
    "v.post_ln.weight": TOWER + "post_layernorm.weight",
    "v.post_ln.bias": TOWER + "post_layernorm.bias",
    "mm.input_projection.weight": PROJECTOR + "mm_input_projection_weight",
    "mm.soft_emb_norm.weight": PROJECTOR + "mm_soft_emb_norm.weight",
    "mm.model.fc.weight": PROJECTOR + "modality_projection.proj.weight",
}
# The converter writes Gemma's (1 + w) norm as 1 + w.
_HELD_AS_ONE_PLUS_W = ("mm.soft_emb_norm.weight",)
# Qwen2.5-VL's: q, k, v and each frame's patch kernel under names of their own until fused.
_QWEN_LAYER_NAMES = {"ln1": "norm1", "ln2": "norm2", "attn_q": "attn.q", "attn_k": "attn.k",
                     "attn_v": "attn.v", "attn_out": "attn.proj", "ffn_gate": "mlp.gate_proj",
                     "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_QWEN_GLOBAL_NAMES = {
    "v.patch_embd.weight": VISUAL + "patch_embed.proj.weight.0",
    "v.patch_embd.weight.1": VISUAL + "patch_embed.proj.weight.1",
    "v.post_ln.weight": VISUAL + "merger.ln_q.weight",
    "mm.0.weight": VISUAL + "merger.mlp.0.weight", "mm.0.bias": VISUAL + "merger.mlp.0.bias",
    "mm.2.weight": VISUAL + "merger.mlp.2.weight", "mm.2.bias": VISUAL + "merger.mlp.2.bias",
}


class MMProjFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._reader = open_gguf_reader(path)
        architecture = self._field("general.architecture")
        if architecture != "clip":
            raise ModelLoadError(f"{path} is a {architecture!r} file, not a vision tower "
                                 "(an mmproj file's architecture is 'clip').")
        if not self._field("clip.has_vision_encoder"):
            raise ModelLoadError(f"{path} holds no vision encoder (an audio tower?): Pagoda "
                                 "reads images only.")
        self.projector_type = self._field("clip.projector_type")
        if self.projector_type not in PROJECTOR_TYPES:
            raise ModelLoadError(
                f"{path}'s projector is {self.projector_type!r}; Pagoda reads "
                f"{', '.join(PROJECTOR_TYPES)} mmproj files so far.")
        self.tensors = {t.name: t for t in self._reader.tensors}

    def _field(self, key: str) -> object:
        field = self._reader.get_field(key)
        return None if field is None else field.contents()

    def _count(self, key: str, most: int) -> int:
        value = self._field(key)
        if not isinstance(value, int) or not 0 < value <= most:
            raise ModelLoadError(f"{self.path} states {key} = {value!r}, where a whole number "
                                 f"from 1 to {most} is needed. The file is damaged: "
                                 "re-download it.")
        return value

    def multimodal_config(self, text: transformers.PretrainedConfig
                          ) -> transformers.PretrainedConfig:
        """The multimodal config whose vision side this file holds, by its projector type,
        beside the language model's config `text` (its image token ids are the caller's to
        set)."""
        if self.projector_type == GEMMA3:
            return self.gemma3_config(text.hidden_size)
        if self.projector_type == IDEFICS3:
            return self.smolvlm_config(text.hidden_size)
        return self.qwen2_5_vl_config(text)

    def gemma3_config(self, text_hidden_size: int) -> transformers.Gemma3Config:
        """The Gemma3Config whose vision side this file holds (the text side: only its width,
        for the projector)."""
        vision = self._vision_config()
        per_side = vision["image_size"] // vision["patch_size"]
        scale = self._scale(per_side, default=4)  # the converter's default for Gemma 3
        return transformers.Gemma3Config(
            vision_config=vision, text_config={"hidden_size": text_hidden_size},
            mm_tokens_per_image=(per_side // scale) ** 2)

    def smolvlm_config(self, text_hidden_size: int) -> transformers.SmolVLMConfig:
        """The SmolVLMConfig whose vision side this file holds (the text side: only its width,
        for the connector), with its processor's settings as `image_tiles`."""
        vision = self._vision_config()
        tile = vision["image_size"]
        config = transformers.SmolVLMConfig(
            vision_config=vision, text_config={"hidden_size": text_hidden_size},
            scale_factor=self._scale(tile // vision["patch_size"], default=2))
        longest = self._field("clip.vision.preproc_image_size")
        config.image_tiles = tile_settings(
            _DEFAULT_TILES_PER_EDGE * tile if longest is None else longest, tile,
            str(self.path), mean=self._field("clip.vision.image_mean") or (0.5,) * 3,
            std=self._field("clip.vision.image_std") or (0.5,) * 3)
        return config

    def _vision_config(self) -> dict[str, int | float]:
        image_size = self._count("clip.vision.image_size", MAX_WIDTH)
        eps = self._field("clip.vision.attention.layer_norm_epsilon")
        return {"hidden_size": self._count("clip.vision.embedding_length", MAX_WIDTH),
                "intermediate_size": self._count("clip.vision.feed_forward_length",
                                                 4 * MAX_WIDTH),
                "num_hidden_layers": self._count("clip.vision.block_count", MAX_LAYERS),
                "num_attention_heads": self._count("clip.vision.attention.head_count",
                                                   MAX_WIDTH),
                "image_size": image_size,
                "patch_size": self._count("clip.vision.patch_size", image_size),
                "layer_norm_eps": 1e-6 if eps is None else float(eps)}

    def _scale(self, per_side: int, default: int) -> int:
        """The projector's clip.vision.projector.scale_factor, which must divide the tower's
        per_side x per_side patches."""
        scale = self._field("clip.vision.projector.scale_factor") or default
        if not isinstance(scale, int) or scale < 1 or per_side % scale:
            raise ModelLoadError(f"{self.path}'s projector merges {scale!r} x {scale!r} patches "
                                 f"of a {per_side} x {per_side} grid: it must divide it.")
        return scale

    def qwen2_5_vl_config(self, text: transformers.PretrainedConfig
                          ) -> transformers.Qwen2_5_VLConfig:
        """The Qwen2_5_VLConfig whose vision side this file holds, around the language model's
        config `text` (its image token ids are the caller's to set)."""
        if not self._field("clip.use_silu"):
            raise ModelLoadError(f"{self.path}'s tower does not use SiLU, as Qwen2.5-VL's do: "
                                 "the file is not one Pagoda reads.")
        depth = self._count("clip.vision.block_count", MAX_LAYERS)
        period = self._count("clip.vision.n_wa_pattern", depth)
        merge = self._field("clip.vision.spatial_merge_size") or QWEN_MERGE_SIZE
        window = self._field("clip.vision.window_size") or QWEN_WINDOW_SIZE
        self._check_clip_normalisation()
        width = self._count("clip.vision.projection_dim", MAX_WIDTH)
        if width != text.hidden_size:
            raise ModelLoadError(f"{self.path}'s tower gives {width}-wide image tokens to a "
                                 f"language model {text.hidden_size} wide: the two files are "
                                 "not one model's.")
        eps = self._field("clip.vision.attention.layer_norm_epsilon")
        vision = {"depth": depth, "hidden_size": self._count("clip.vision.embedding_length",
                                                            MAX_WIDTH),
                  "intermediate_size": self._count("clip.vision.feed_forward_length",
                                                   4 * MAX_WIDTH),
                  "num_heads": self._count("clip.vision.attention.head_count", MAX_WIDTH),
                  "patch_size": self._count("clip.vision.patch_size", MAX_WIDTH),
                  "spatial_merge_size": merge, "window_size": window, "temporal_patch_size": 2,
                  "fullatt_block_indexes": [i for i in range(depth) if (i + 1) % period == 0],
                  "out_hidden_size": width, "hidden_act": "silu",
                  "rms_norm_eps": 1e-6 if eps is None else float(eps)}
        return transformers.Qwen2_5_VLConfig(text_config=text.to_dict(), vision_config=vision)

    def _check_clip_normalisation(self) -> None:
        """Qwen2.5-VL's processor normalises by CLIP's mean and std, which Pagoda's makes; a
        file stating others is refused rather than fed pixels it was not trained on."""
        for key, ours in (("clip.vision.image_mean", CLIP_MEAN), ("clip.vision.image_std",
                                                                 CLIP_STD)):
            stated = self._field(key)
            if stated is not None and (len(stated) != 3 or any(
                    abs(a - b) > 1e-6 for a, b in zip(stated, ours, strict=False))):
                raise ModelLoadError(f"{self.path} normalises images by {key} = {stated}, "
                                     f"where Qwen2.5-VL's processor uses {list(ours)}: Pagoda "
                                     "does not read this tower.")

    def weights(self, config: transformers.PretrainedConfig) -> dict[str, torch.Tensor]:
        """Every tensor under its transformers name, float32, its shape checked against
        config's (a damaged file is refused, never misread)."""
        qwen = self.projector_type == QWEN2_5_VL
        expected = _qwen_expected_shapes(config) if qwen else _expected_shapes(config)
        weights = {}
        for name, tensor in self.tensors.items():
            hf_name = _qwen_name(name) if qwen else _hf_name(name)
            if hf_name is None:
                continue
            shape = tensor_shape(tensor)
            want = expected.pop(hf_name, None)
            if want is None or squeezed_shape(shape) != squeezed_shape(want):
                raise ModelLoadError(f"{self.path}'s tensor {name} has shape {shape}, where "
                                     f"{want} is expected. The file is damaged: re-download it.")
            value = dequantize_to_float(tensor.data, tensor.tensor_type, shape).float()
            if name in _HELD_AS_ONE_PLUS_W:
                value = value - 1.0
            weights[hf_name] = value.reshape(want)
        if expected:
            raise ModelLoadError(f"{self.path} has no tensor for {sorted(expected)[0]} (and "
                                 f"{len(expected) - 1} more). The file is incomplete: "
                                 "re-download it.")
        return _qwen_fused(weights, config.vision_config.depth) if qwen else weights


def _hf_name(name: str) -> str | None:
    return _renamed(name, _GLOBAL_NAMES, _LAYER_NAMES, f"{TOWER}encoder.layers")


def _renamed(name: str, global_names: dict[str, str], layer_names: dict[str, str],
             layers: str) -> str | None:
    """The file's tensor name as the builders read it (a layer's under `layers`.N); None for a
    name they do not read."""
    if name in global_names:
        return global_names[name]
    layer = _LAYER.fullmatch(name)
    if layer is None or layer.group(2) not in layer_names:
        return None
    index, part, suffix = layer.groups()
    return f"{layers}.{index}.{layer_names[part]}.{suffix}"


def _expected_shapes(config: transformers.PretrainedConfig) -> dict[str, tuple[int, ...]]:
    v = config.vision_config
    hidden, inner = v.hidden_size, v.intermediate_size
    shapes = {
        TOWER + "embeddings.patch_embedding.weight": (hidden, 3, v.patch_size, v.patch_size),
        TOWER + "embeddings.patch_embedding.bias": (hidden,),
        TOWER + "embeddings.position_embedding.weight":
            ((v.image_size // v.patch_size) ** 2, hidden),
        TOWER + "post_layernorm.weight": (hidden,), TOWER + "post_layernorm.bias": (hidden,),
    } | _projector_shapes(config)
    parts = {"layer_norm1": ((hidden,), (hidden,)), "layer_norm2": ((hidden,), (hidden,)),
             **{f"self_attn.{p}_proj": ((hidden, hidden), (hidden,)) for p in "qkv"},
             "self_attn.out_proj": ((hidden, hidden), (hidden,)),
             "mlp.fc1": ((inner, hidden), (inner,)), "mlp.fc2": ((hidden, inner), (hidden,))}
    for i in range(v.num_hidden_layers):
        for part, (weight, bias) in parts.items():
            shapes[f"{TOWER}encoder.layers.{i}.{part}.weight"] = weight
            shapes[f"{TOWER}encoder.layers.{i}.{part}.bias"] = bias
    return shapes


def _projector_shapes(config: transformers.PretrainedConfig) -> dict[str, tuple[int, ...]]:
    hidden, text = config.vision_config.hidden_size, config.text_config.hidden_size
    if config.model_type in ("smolvlm", "idefics3"):
        return {PROJECTOR + "modality_projection.proj.weight":
                (text, hidden * config.scale_factor ** 2)}
    return {PROJECTOR + "mm_input_projection_weight": (hidden, text),
            PROJECTOR + "mm_soft_emb_norm.weight": (hidden,)}


def _qwen_name(name: str) -> str | None:
    return _renamed(name, _QWEN_GLOBAL_NAMES, _QWEN_LAYER_NAMES, f"{VISUAL}blocks")


def _qwen_fused(weights: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """q, k and v as one qkv projection, and the frames' patch kernels as one 3-D kernel, as
    transformers' modules hold them."""
    kernel = VISUAL + "patch_embed.proj.weight"
    weights[kernel] = torch.stack([weights.pop(f"{kernel}.{t}") for t in range(2)], dim=2)
    for i in range(depth):
        attn = f"{VISUAL}blocks.{i}.attn."
        for suffix in ("weight", "bias"):
            weights[f"{attn}qkv.{suffix}"] = torch.cat(
                [weights.pop(f"{attn}{p}.{suffix}") for p in "qkv"])
    return weights


def _qwen_expected_shapes(config: transformers.PretrainedConfig) -> dict[str, tuple[int, ...]]:
    v = config.vision_config
    hidden, inner, patch = v.hidden_size, v.intermediate_size, v.patch_size
    merged = hidden * v.spatial_merge_size ** 2
    shapes = {
        VISUAL + "patch_embed.proj.weight.0": (hidden, 3, patch, patch),
        VISUAL + "patch_embed.proj.weight.1": (hidden, 3, patch, patch),
        VISUAL + "merger.ln_q.weight": (hidden,),
        VISUAL + "merger.mlp.0.weight": (merged, merged), VISUAL + "merger.mlp.0.bias": (merged,),
        VISUAL + "merger.mlp.2.weight": (v.out_hidden_size, merged),
        VISUAL + "merger.mlp.2.bias": (v.out_hidden_size,),
    }
    parts = {**{f"attn.{p}": ((hidden, hidden), (hidden,)) for p in "qkv"},
             "attn.proj": ((hidden, hidden), (hidden,)),
             "mlp.gate_proj": ((inner, hidden), (inner,)), "mlp.up_proj": ((inner, hidden), (inner,)),
             "mlp.down_proj": ((hidden, inner), (hidden,))}
    for i in range(v.depth):
        at = f"{VISUAL}blocks.{i}."
        shapes[at + "norm1.weight"] = shapes[at + "norm2.weight"] = (hidden,)
        for part, (weight, bias) in parts.items():
            shapes[f"{at}{part}.weight"] = weight
            shapes[f"{at}{part}.bias"] = bias
    return shapes
