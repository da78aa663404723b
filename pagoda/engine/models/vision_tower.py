"""A multimodal model's image side built from its weights: Gemma 3's SigLIP tower
(pagoda/engine/layers/vision_encoder.py) or Qwen2.5-VL's windowed one
(pagoda/engine/layers/grid_vision_encoder.py), and the family's projector
(pagoda/engine/layers/vision_projector.py), under the names of transformers 5's own modules
(`vision_tensor_name` maps a folder's other spellings to them).

Gemma 3 sees an image as one square; SmolVLM as tiles of its tower's side (`TileSettings`), each
encoded and projected on its own, each its own run of placeholders; Qwen2.5-VL as a grid of its
own proportions (`GridImageTower`). Both kinds of tower give `embed`: each piece's pixels in,
each piece's token embeddings out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.grid_vision_encoder import (
    GridVisionEncoder,
    GridVisionLayer,
    GridVisionShape,
    PatchGrid,
)
from pagoda.engine.layers.linear import Placement, make_fused_linear, make_linear
from pagoda.engine.layers.vision_encoder import (
    Norm,
    VisionEncoder,
    VisionEncoderLayer,
    VisionShape,
)
from pagoda.engine.layers.vision_projector import (
    PatchMerger,
    PixelShuffleProjector,
    PooledProjector,
)
from pagoda.engine.quantization.tensors import Weight

TOWER = "model.vision_tower."
PROJECTOR = "model.multi_modal_projector."
VISUAL = "model.visual."  # Qwen2.5-VL's tower and its merger
# The multimodal model types whose image side Pagoda runs (config.model_type).
IMAGE_TOWERS = ("gemma3", "smolvlm", "idefics3", "qwen2_5_vl")
# SmolVLM's: SmolVLM2 folders say "smolvlm", SmolVLM's first ones (Idefics3's classes) "idefics3".
SMOLVLM_TYPES = ("smolvlm", "idefics3")
# Gemma 3's image tokens in its vocabulary: an image's start, each of its placeholders, its end.
GEMMA3_IMAGE_TOKENS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")
# SmolVLM's, as its processor writes them: around each tile, the whole image's tag, each
# placeholder (a tile's place in the grid, <row_1_col_2>, is a token of its own as well).
SMOLVLM_IMAGE_TOKENS = ("<fake_token_around_image>", "<global-img>", "<image>")
# Qwen2.5-VL's, as its chat template writes an image: <|vision_start|><|image_pad|><|vision_end|>.
QWEN2_5_VL_IMAGE_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
# The pixels Qwen2.5-VL's processor brings an image's area within: its own least (4 tokens), and
# at most 4,096 tokens' worth, as llama.cpp's mtmd bounds it (the released preprocessor allows
# 16,384 tokens, 12.8 million pixels, an image: minutes of a CPU's prefill).
QWEN2_5_VL_MIN_PIXELS = 56 * 56
QWEN2_5_VL_MAX_PIXELS = 4096 * 28 * 28
# The mean and standard deviation Qwen2.5-VL's processor normalises pixels by (OpenAI CLIP's).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# The most pixels SmolVLM's processor resizes an image's longest edge to (transformers'
# MAX_IMAGE_SIZE): a folder's preprocessor_config.json asking for more is refused.
MAX_LONGEST_EDGE = 4096
# The tower's and projector's tensors as folders name them: released checkpoints
# (vision_tower.vision_model.*, multi_modal_projector.*), transformers 5's saves (vision_tower.*)
# and its modules (model.vision_tower.*); SmolVLM's tower (model.vision_model.*) and connector
# (model.connector.*); Qwen2.5-VL's tower and merger (visual.* as released, model.visual.* as
# transformers 5's modules name them).
_FOLDER_NAMES = re.compile(r"(?:model\.)?(?:(vision_tower\.(?:vision_model\.)?|vision_model\.)|"
                           r"(multi_modal_projector\.|connector\.)|visual\.)(.+)")


@dataclass(frozen=True, slots=True)
class TileSettings:
    """How SmolVLM's processor makes tiles of an image (its preprocessor_config.json): the
    image's longest edge resized to longest_edge, aspect kept; then, with split, cut into tiles
    of the tower's side, the whole image shrunk to one more tile after them; without, the whole
    image alone, squashed to one tile. resample: PIL's filter (1: Lanczos)."""

    longest_edge: int
    split: bool = True
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    resample: int = 1


@dataclass(slots=True)
class ImageTower:
    """Pixels -> the language model's image token embeddings. bidirectional: the language
    model's attention lets an image's tokens see each other (Gemma 3's), not only those before
    them."""

    encoder: VisionEncoder
    projector: PooledProjector | PixelShuffleProjector
    image_token_id: int  # the placeholder each image embedding replaces
    # The tokens around an image's placeholders (Gemma 3's start and end of image; SmolVLM's
    # <fake_token_around_image> both).
    start_token_id: int
    end_token_id: int
    bidirectional: bool = False
    # SmolVLM's: an image is tiles, each tokens_per_image placeholders. None: one square image.
    tiles: TileSettings | None = None

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
        """[images (or tiles), 3, side, side] -> [images, tokens_per_image, text width]."""
        return self.projector(self.encoder(pixels))

    def embed(self, pixels: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Each image's (or tile's) [3, side, side] pixels -> its [tokens_per_image, text width],
        all in one call of the encoder."""
        return list(self(torch.stack(pixels).to(device)).unbind(0))


@dataclass(slots=True)
class GridImageTower:
    """Qwen2.5-VL's image side: an image of its own proportions -> one token embedding per merge
    unit of its patches, row by row. Its language model attends causally within an image."""

    encoder: GridVisionEncoder
    merger: PatchMerger
    image_token_id: int
    start_token_id: int  # <|vision_start|>
    end_token_id: int  # <|vision_end|>
    min_pixels: int = QWEN2_5_VL_MIN_PIXELS
    max_pixels: int = QWEN2_5_VL_MAX_PIXELS
    bidirectional: bool = False

    @property
    def dtype(self) -> torch.dtype:
        """What the tower computes in (EngineConfig.vision_dtype)."""
        return self.encoder.layers[0].norm1.dtype

    def embed(self, grids: list[PatchGrid], device: torch.device) -> list[torch.Tensor]:
        """Each image's patches -> its [merge units, text width], image by image (each attends
        within itself only)."""
        return [self.merger(self.encoder(PatchGrid(g.patches.to(device), g.rows, g.columns)))
                for g in grids]


def vision_tensor_name(name: str) -> str | None:
    """A folder's name of a tower or projector tensor under the names the builders read; None
    for any other tensor."""
    match = _FOLDER_NAMES.fullmatch(name)
    if match is None:
        return None
    tower, projector, rest = match.groups()
    return (TOWER if tower else PROJECTOR if projector else VISUAL) + rest


def image_tower(config: PretrainedConfig, weights: Mapping[str, Weight],
                placement: Placement) -> ImageTower | GridImageTower:
    """The image side of a multimodal model of IMAGE_TOWERS (config: its whole config)."""
    if config.model_type == "gemma3":
        return gemma3_image_tower(config, weights, placement)
    if config.model_type in SMOLVLM_TYPES:
        return smolvlm_image_tower(config, weights, placement)
    if config.model_type == "qwen2_5_vl":
        return qwen2_5_vl_image_tower(config, weights, placement)
    raise ModelLoadError(f"Pagoda does not run the image side of {config.model_type!r} "
                         f"models yet (it runs {', '.join(IMAGE_TOWERS)}).")


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


def smolvlm_image_tower(config: PretrainedConfig, weights: Mapping[str, Weight],
                        placement: Placement) -> ImageTower:
    """SmolVLM's SigLIP tower and pixel-shuffle connector (config: SmolVLMConfig or
    Idefics3Config, with the processor's `image_tiles` and the vocabulary's
    `fake_image_token_id`, which the loader adds)."""
    shape = vision_shape(config.vision_config)
    scale = config.scale_factor
    if not isinstance(scale, int) or scale < 1 or shape.patches_per_side % scale:
        raise ModelLoadError(
            f"config.json's scale_factor {scale!r} does not divide the tower's "
            f"{shape.patches_per_side} x {shape.patches_per_side} patches. The model's settings "
            "are damaged.")
    projector = PixelShuffleProjector(
        patches_per_side=shape.patches_per_side, scale=scale,
        projection=make_linear(_tensor(weights, PROJECTOR + "modality_projection.proj.weight"),
                               None, placement))
    encoder = siglip_encoder(shape, config.vision_config.num_hidden_layers, weights, TOWER,
                             placement)
    around = config.fake_image_token_id
    return ImageTower(encoder, projector, config.image_token_id, around, around,
                      tiles=config.image_tiles)


def qwen2_5_vl_image_tower(config: PretrainedConfig, weights: Mapping[str, Weight],
                           placement: Placement) -> GridImageTower:
    """Qwen2.5-VL's windowed tower and its patch merger (config: Qwen2_5_VLConfig)."""
    vision = config.vision_config
    if vision.hidden_act != "silu":
        raise ModelLoadError(f"The vision tower's MLP uses {vision.hidden_act!r}; Pagoda runs "
                             "Qwen2.5-VL's towers with SiLU (SwiGLU) only.")
    if vision.hidden_size % (4 * vision.num_heads) or vision.in_channels != 3:
        raise ModelLoadError(
            f"The vision tower's width {vision.hidden_size} is not a whole number of heads "
            f"({vision.num_heads}) whose size divides by 4 (2-D RoPE), or it reads "
            f"{vision.in_channels} channels. The model's settings are damaged.")
    shape = GridVisionShape(
        patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size, hidden_size=vision.hidden_size,
        num_heads=vision.num_heads, window_size=vision.window_size,
        full_attention_layers=frozenset(vision.fullatt_block_indexes),
        norm_eps=getattr(vision, "rms_norm_eps", 1e-6))
    merger = PatchMerger(unit=shape.merge_size ** 2,
                         norm_weight=_vector(weights, VISUAL + "merger.ln_q.weight", placement),
                         eps=shape.norm_eps,
                         fc1=_biased(weights, VISUAL + "merger.mlp.0", placement),
                         fc2=_biased(weights, VISUAL + "merger.mlp.2", placement))
    rope_theta = float((getattr(vision, "rope_parameters", None) or {}).get("rope_theta", 1e4))
    return GridImageTower(_grid_encoder(shape, vision.depth, rope_theta, weights, placement),
                          merger, config.image_token_id, config.vision_start_token_id,
                          config.vision_end_token_id)


def _grid_encoder(shape: GridVisionShape, depth: int, rope_theta: float,
                  weights: Mapping[str, Weight], placement: Placement) -> GridVisionEncoder:
    layers = []
    for i in range(depth):
        at = f"{VISUAL}blocks.{i}."
        mlp = at + "mlp."
        layers.append(GridVisionLayer(
            norm1=_vector(weights, at + "norm1.weight", placement),
            qkv_proj=_biased(weights, at + "attn.qkv", placement),
            out_proj=_biased(weights, at + "attn.proj", placement),
            norm2=_vector(weights, at + "norm2.weight", placement),
            gate_up_proj=make_fused_linear(
                [_tensor(weights, mlp + "gate_proj.weight"),
                 _tensor(weights, mlp + "up_proj.weight")],
                torch.cat([_vector(weights, mlp + f"{p}_proj.bias", placement)
                           for p in ("gate", "up")]), placement),
            down_proj=_biased(weights, mlp + "down_proj", placement)))
    kernel = _tensor(weights, VISUAL + "patch_embed.proj.weight")
    if tuple(kernel.shape[1:]) != (shape.channels, shape.temporal_patch_size, shape.patch_size,
                                   shape.patch_size):
        raise ModelLoadError(f"The vision tower's patch kernel is {list(kernel.shape)}, where "
                             f"[{shape.hidden_size}, {shape.channels}, "
                             f"{shape.temporal_patch_size}, {shape.patch_size}, "
                             f"{shape.patch_size}] is expected. The model's files are damaged.")
    # transformers' 2-D RoPE: a quarter of the head's pairs per axis, over half its width.
    half = shape.head_dim // 2
    frequencies = 1.0 / rope_theta ** (torch.arange(0, half, 2, dtype=torch.float) / half)
    return GridVisionEncoder(shape, make_linear(kernel.reshape(kernel.shape[0], -1), None,
                                                placement),
                             layers, frequencies.to(placement.device))


def _biased(weights: Mapping[str, Weight], name: str, placement: Placement):
    return make_linear(_tensor(weights, name + ".weight"),
                       _vector(weights, name + ".bias", placement), placement)


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
