"""A multimodal model's image side built from its weights: the SigLIP tower
(pagoda/engine/layers/vision_encoder.py) and the family's projector
(pagoda/engine/layers/vision_projector.py), under the names of transformers 5's own modules
(`vision_tensor_name` maps a folder's other spellings to them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.linear import Placement, make_fused_linear, make_linear
from pagoda.engine.layers.vision_encoder import (
    Norm,
    VisionEncoder,
    VisionEncoderLayer,
    VisionShape,
)
from pagoda.engine.layers.vision_projector import PooledProjector
from pagoda.engine.quantization.tensors import Weight

TOWER = "model.vision_tower."
PROJECTOR = "model.multi_modal_projector."
# The multimodal model types whose image side Pagoda runs (config.model_type).
IMAGE_TOWERS = ("gemma3",)
# Gemma 3's image tokens in its vocabulary: an image's start, each of its placeholders, its end.
GEMMA3_IMAGE_TOKENS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")
# The tower's and projector's tensors as folders name them: released checkpoints
# (vision_tower.vision_model.*, multi_modal_projector.*), transformers 5's saves (vision_tower.*)
# and its modules (model.vision_tower.*).
_FOLDER_NAMES = re.compile(r"(?:model\.)?(?:(vision_tower)\.(?:vision_model\.)?|"
                           r"(multi_modal_projector)\.)(.+)")


@dataclass(slots=True)
class ImageTower:
    """Pixels -> the language model's image token embeddings. bidirectional: the language
    model's attention lets an image's tokens see each other (Gemma 3's), not only those before
    them."""

    encoder: VisionEncoder
    projector: PooledProjector
    image_token_id: int  # the placeholder each image embedding replaces
    # The tokens around an image's placeholders (Gemma 3's start and end of image).
    start_token_id: int
    end_token_id: int
    bidirectional: bool = False

    @property
    def dtype(self) -> torch.dtype:
        """What the tower computes in (EngineConfig.vision_dtype)."""
        return self.encoder.positions.dtype

    @property
    def image_size(self) -> int:
        return self.encoder.shape.image_size

    @property
    def tokens_per_image(self) -> int:
        return self.projector.tokens_per_image

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """[images, 3, side, side] -> [images, tokens_per_image, text width]."""
        return self.projector(self.encoder(pixels))


def vision_tensor_name(name: str) -> str | None:
    """A folder's name of a tower or projector tensor under the names the builders read; None
    for any other tensor."""
    match = _FOLDER_NAMES.fullmatch(name)
    if match is None:
        return None
    tower, projector, rest = match.groups()
    return (TOWER if tower else PROJECTOR) + rest


def image_tower(config: PretrainedConfig, weights: Mapping[str, Weight],
                placement: Placement) -> ImageTower:
    """The image side of a multimodal model of IMAGE_TOWERS (config: its whole config)."""
    if config.model_type != "gemma3":
        raise ModelLoadError(f"Pagoda does not run the image side of {config.model_type!r} "
                             f"models yet (it runs {', '.join(IMAGE_TOWERS)}).")
    return gemma3_image_tower(config, weights, placement)


def vision_shape(vision: PretrainedConfig) -> VisionShape:
    if vision.hidden_act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelLoadError(f"The vision tower uses the activation {vision.hidden_act!r}; "
                             "Pagoda runs SigLIP towers with tanh GELU only.")
    if vision.image_size % vision.patch_size or vision.hidden_size % vision.num_attention_heads:
        raise ModelLoadError(
            f"The vision tower's image_size {vision.image_size} is not a whole number of "
            f"patches of {vision.patch_size}, or its width {vision.hidden_size} of heads "
            f"({vision.num_attention_heads}). The model's settings are damaged.")
    return VisionShape(image_size=vision.image_size, patch_size=vision.patch_size,
                       hidden_size=vision.hidden_size, num_heads=vision.num_attention_heads,
                       layer_norm_eps=vision.layer_norm_eps, channels=vision.num_channels)


def gemma3_image_tower(config: PretrainedConfig, weights: Mapping[str, Weight],
                       placement: Placement) -> ImageTower:
    """Gemma 3's SigLIP tower and pooled projector (config: Gemma3Config)."""
    shape = vision_shape(config.vision_config)
    tokens_per_side = round(config.mm_tokens_per_image ** 0.5)
    if (tokens_per_side ** 2 != config.mm_tokens_per_image
            or shape.patches_per_side % tokens_per_side):
        raise ModelLoadError(
            f"config.json's mm_tokens_per_image {config.mm_tokens_per_image} is not a square "
            f"that divides the tower's {shape.patches_per_side} x {shape.patches_per_side} "
            "patches. The model's settings are damaged.")
    projector = PooledProjector(
        patches_per_side=shape.patches_per_side, tokens_per_side=tokens_per_side,
        norm_weight=_vector(weights, PROJECTOR + "mm_soft_emb_norm.weight", placement),
        eps=config.vision_config.layer_norm_eps,
        projection=make_linear(_tensor(weights, PROJECTOR + "mm_input_projection_weight").t()
                               .contiguous(), None, placement))
    return ImageTower(siglip_encoder(shape, config.vision_config.num_hidden_layers, weights,
                                     TOWER, placement), projector, config.image_token_index,
                      config.boi_token_index, config.eoi_token_index, bidirectional=True)


def siglip_encoder(shape: VisionShape, num_layers: int, weights: Mapping[str, Weight],
                   prefix: str, placement: Placement) -> VisionEncoder:
    def vector(name: str) -> torch.Tensor:
        return _vector(weights, prefix + name, placement)

    def norm(name: str) -> Norm:
        return Norm(vector(f"{name}.weight"), vector(f"{name}.bias"))

    def linear(name: str):
        return make_linear(weights[prefix + f"{name}.weight"], vector(f"{name}.bias"), placement)

    layers = []
    for i in range(num_layers):
        at = f"encoder.layers.{i}."
        attn = at + "self_attn."
        qkv = make_fused_linear(
            [weights[prefix + attn + f"{p}_proj.weight"] for p in "qkv"],
            torch.cat([vector(attn + f"{p}_proj.bias") for p in "qkv"]), placement)
        layers.append(VisionEncoderLayer(
            norm1=norm(at + "layer_norm1"), qkv_proj=qkv, out_proj=linear(attn + "out_proj"),
            norm2=norm(at + "layer_norm2"), fc1=linear(at + "mlp.fc1"),
            fc2=linear(at + "mlp.fc2")))
    patch = _tensor(weights, prefix + "embeddings.patch_embedding.weight")
    return VisionEncoder(
        shape=shape,
        patch_embedding=make_linear(patch.reshape(patch.shape[0], -1),
                                    vector("embeddings.patch_embedding.bias"), placement),
        positions=vector("embeddings.position_embedding.weight"),
        layers=layers, post_norm=norm("post_layernorm"))


def _tensor(weights: Mapping[str, Weight], name: str) -> torch.Tensor:
    tensor = weights.get(name)
    if not isinstance(tensor, torch.Tensor):
        raise ModelLoadError(f"The vision tower's {name} is missing or not a float tensor.")
    return tensor


def _vector(weights: Mapping[str, Weight], name: str, placement: Placement) -> torch.Tensor:
    return _tensor(weights, name).to(device=placement.device, dtype=placement.dtype)
