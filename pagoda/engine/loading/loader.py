"""Turn a model source (nothing, a .gguf file or a Hugging Face folder) into config, tokenizer and weights.

A GGUF file is read as it is (`pagoda.engine.loading.gguf`): its quantized tensors stay quantized, and
its config and tokenizer are cached by content under the user cache dir after the first load.
A Hugging Face folder gives float tensors.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors import SafetensorError, safe_open

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.folders import cache_dir
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.loading.mmproj import GEMMA3, IDEFICS3, QWEN2_5_VL, MMProjFile
from pagoda.engine.loading.model_check import check_config_supported
from pagoda.engine.loading.model_files import default_model_file, model_name
from pagoda.engine.loading.on_load import apply_quantization
from pagoda.engine.loading.tile_settings import folder_tile_settings
from pagoda.engine.models.mtp import PREFIX as MTP_PREFIX
from pagoda.engine.models.registry import (
    expected_weight_shapes,
    family_for_model_type,
    optional_weight_shapes,
    supported_model_types,
    text_model_config,
)
from pagoda.engine.models.vision_tower import (
    GEMMA3_IMAGE_TOKENS,
    IMAGE_TOWERS,
    QWEN2_5_VL_IMAGE_TOKENS,
    SMOLVLM_IMAGE_TOKENS,
    SMOLVLM_TYPES,
    vision_tensor_name,
)
from pagoda.engine.quantization.tensors import Weight, weight_shape

# step name, steps done, steps in all
ProgressCallback = Callable[[str, int, int], None]

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = supported_model_types()
SHARD_INDEX = "model.safetensors.index.json"
# Raised whenever the config or tokenizer built from a GGUF file changes (2: each family builds
# its own config from the file's keys), so no cache of an older build is read.
METADATA_FORMAT = 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True, slots=True)
class _ImageTokens:
    """A family's image tokens in its vocabulary (what its processor writes around and for an
    image), and the multimodal config's attributes that hold their ids (None: not one)."""

    family: str  # as users know it
    tokens: tuple[str, str, str]
    attributes: tuple[str | None, str | None, str | None]
    placeholder_at: int = 1  # which of the tokens each image embedding replaces

    @property
    def placeholder(self) -> str:
        return self.tokens[self.placeholder_at]


_GEMMA3_TOKENS = _ImageTokens("Gemma 3", GEMMA3_IMAGE_TOKENS,
                              ("boi_token_index", "image_token_index", "eoi_token_index"))
# Around each tile, the whole image's tag (a token of the layout, no config's), the placeholder.
_SMOLVLM_TOKENS = _ImageTokens("SmolVLM", SMOLVLM_IMAGE_TOKENS,
                               ("fake_image_token_id", None, "image_token_id"), placeholder_at=2)
_QWEN2_5_VL_TOKENS = _ImageTokens("Qwen2.5-VL", QWEN2_5_VL_IMAGE_TOKENS,
                                  ("vision_start_token_id", "image_token_id",
                                   "vision_end_token_id"))
# Per mmproj projector type: the language model's model_type it goes with, and its family's
# image tokens.
_MMPROJ_MODELS = {GEMMA3: ("gemma3_text", _GEMMA3_TOKENS), IDEFICS3: ("llama", _SMOLVLM_TOKENS),
                  QWEN2_5_VL: ("qwen2_5_vl_text", _QWEN2_5_VL_TOKENS)}


@dataclass(slots=True)
class LoadedModel:
    """path: the .gguf file or the model folder. weights: by Hugging Face parameter name."""

    name: str
    path: Path
    config: transformers.PretrainedConfig
    tokenizer: transformers.PreTrainedTokenizerBase
    weights: MutableMapping[str, Weight]  # possibly decoded lazily (pagoda.engine.loading.lazy_weights)
    # A multimodal model's whole config and its image side's tensors (under the names
    # pagoda.engine.models.vision_tower reads), where Pagoda runs its images; None otherwise.
    multimodal_config: transformers.PretrainedConfig | None = None
    vision_weights: dict[str, torch.Tensor] | None = None


def load_model(
    source: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32,
    on_progress: ProgressCallback | None = None, quantization: str = "auto",
    mmproj: str | os.PathLike | None = None, mtp: bool = True,
) -> LoadedModel:
    """quantization (EngineConfig.quantization): "auto" keeps a GGUF file's quantized tensors
    in the engine's layouts and a folder's float weights as they are, "none" dequantizes
    everything to dtype, "int8"/"int4" quantize every matrix on load. on_progress(step, done,
    total) reports a GGUF file's load steps. mmproj: a GGUF model's vision tower
    (EngineConfig.mmproj). mtp: read a multi-token-prediction block where the files carry one
    (the engine builds it only to speculate; a GGUF file's tensors are read only when used)."""
    _remove_old_conversions()
    path = _source_path(source)
    if path.is_dir():
        if mmproj is not None:
            raise ModelLoadError(f"{path} is a model folder, which holds its own vision tower "
                                 "where it has one: an mmproj file goes with a .gguf model")
        loaded = _load_folder(path, model_name(path), dtype, mtp)
    else:
        loaded = _load_gguf(_gguf_path(path), dtype, quantization, on_progress)
        if mmproj is not None:
            _attach_mmproj(loaded, Path(mmproj), dtype)
    loaded.weights = apply_quantization(loaded.weights, quantization)
    return loaded


def _attach_mmproj(loaded: LoadedModel, path: Path, dtype: torch.dtype) -> None:
    """The vision tower of `path` (an mmproj GGUF) as the loaded model's image side, its image
    tokens found in the model's vocabulary; ModelLoadError where the two do not belong
    together."""
    file = MMProjFile(path)
    text_type, tokens = _MMPROJ_MODELS[file.projector_type]
    if loaded.config.model_type != text_type:
        raise ModelLoadError(f"{path} is a {tokens.family} vision tower, and {loaded.path.name} "
                             f"is a {loaded.config.model_type} model: an mmproj file goes with "
                             "the model it was converted with")
    config = file.multimodal_config(loaded.config)
    _add_image_tokens(config, loaded.tokenizer, tokens, f"{loaded.path.name}'s vocabulary")
    loaded.multimodal_config = config
    loaded.vision_weights = {name: t.to(dtype) for name, t in file.weights(config).items()}


def _add_image_tokens(config: transformers.PretrainedConfig,
                      tokenizer: transformers.PreTrainedTokenizerBase, tokens: _ImageTokens,
                      where: str, stated: int | None = None) -> None:
    """The family's image tokens' ids on its multimodal config; ModelLoadError where the
    vocabulary lacks one, or holds another placeholder than the one config.json states
    (`stated`)."""
    vocab = tokenizer.get_vocab()
    missing = [t for t in tokens.tokens if t not in vocab]
    if missing:
        raise ModelLoadError(f"{where} has no {missing[0]}, which {tokens.family}'s images "
                             "need: the model's files are not one model's, or are damaged")
    placeholder = vocab[tokens.placeholder]
    if stated is not None and stated != placeholder:
        raise ModelLoadError(f"config.json's image_token_id is {stated}, where {where} holds "
                             f"{tokens.placeholder} as {placeholder}: the model's files are not "
                             "one model's, or are damaged")
    for token, attribute in zip(tokens.tokens, tokens.attributes, strict=True):
        if attribute is not None:
            setattr(config, attribute, vocab[token])


def tokenizer_folder(source: str | os.PathLike | None = None) -> Path:
    """A folder with the source's tokenizer files (and config.json): a model folder itself, or
    a GGUF file's cached copy, written on first use."""
    path = _source_path(source)
    if path.is_dir():
        return path
    gguf = _gguf_path(path)
    cache = metadata_cache_folder(gguf)
    GGUFModelFile(gguf).config_and_tokenizer(cache)
    return cache


def _gguf_path(path: Path) -> Path:
    if path.suffix.lower() != ".gguf":
        raise ModelLoadError(
            f"{path} is neither a model folder nor a .gguf file. Pass a Hugging Face model folder "
            "(config.json, *.safetensors, tokenizer files) or a .gguf file."
        )
    return path


_GGUF_STEPS = ("reading the model file", "reading the tokenizer", "decoding the weights")


def _load_gguf(path: Path, dtype: torch.dtype, quantization: str,
               on_progress: ProgressCallback | None) -> LoadedModel:
    def step(done: int) -> None:
        if on_progress is not None:
            on_progress(_GGUF_STEPS[min(done, len(_GGUF_STEPS) - 1)], done, len(_GGUF_STEPS))

    step(0)
    gguf = GGUFModelFile(path)
    step(1)
    config, tokenizer = gguf.config_and_tokenizer(metadata_cache_folder(path))
    check_config_supported(config.to_dict(), path)
    step(2)
    expected = expected_weight_shapes(config)
    optional = optional_weight_shapes(config)
    if optional and all(gguf.has_tensor(name) for name in optional):
        expected |= optional  # a multi-token-prediction block, read as the model's tensors
    weights = gguf.weights(expected, config, quantization, dtype)
    step(3)
    return LoadedModel(name=model_name(path), path=path, config=config, tokenizer=tokenizer,
                       weights=weights)


def metadata_cache_folder(gguf: Path) -> Path:
    """Where a GGUF file's config and tokenizer are cached, keyed by its content.

    A copy of the same file (the package reinstalled into a new venv, a moved download) reuses
    the cache; a changed file gets a new folder, and so does every file when the way a config
    is built from a file changes (`METADATA_FORMAT`).
    """
    return cache_dir() / "gguf" / f"{gguf.stem}-{_content_key(gguf)}-v{METADATA_FORMAT}"


def _content_key(path: Path, samples: int = 16, chunk: int = 1 << 16) -> str:
    """Hash of the size, the header and evenly spaced chunks: milliseconds, not a full read.

    Two different models of one architecture and quantization share their size and header but
    not their tensor bytes, which the spaced chunks sample.
    """
    size = path.stat().st_size
    digest = hashlib.blake2b(str(size).encode(), digest_size=6)
    with path.open("rb") as f:
        digest.update(f.read(1 << 20))
        for i in range(samples):
            f.seek(size * i // samples)
            digest.update(f.read(chunk))
    return digest.hexdigest()


def _remove_old_conversions() -> None:
    """Earlier versions dequantized GGUF files into fp32 folders here (about 500 MB each)."""
    old = cache_dir() / "models"
    if old.is_dir():
        logger.info("Removing %s: GGUF files load directly now, these conversions are unused", old)
        shutil.rmtree(old, ignore_errors=True)


def _source_path(source: str | os.PathLike | None) -> Path:
    path = default_model_file() if source is None else Path(source).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"Model path {path} does not exist. Pass a Hugging Face model folder or a .gguf file."
        )
    return path


def _load_folder(folder: Path, name: str, dtype: torch.dtype, mtp: bool) -> LoadedModel:
    config, whole = _read_config(folder)
    weights = _read_weights(folder, config, dtype, mtp)
    tokenizer = _read_tokenizer(folder, config)
    loaded = LoadedModel(name=name, path=folder, config=config, tokenizer=tokenizer,
                         weights=weights)
    if whole.model_type in IMAGE_TOWERS:
        loaded.multimodal_config = whole
        loaded.vision_weights = _read_vision_weights(folder, dtype)
    if whole.model_type in SMOLVLM_TYPES:
        whole.image_tiles = folder_tile_settings(folder, whole.vision_config.image_size)
        _add_image_tokens(whole, tokenizer, _SMOLVLM_TOKENS, f"{folder.name}'s vocabulary",
                          stated=whole.image_token_id)
    return loaded


def _read_config(folder: Path) -> tuple[transformers.PretrainedConfig,
                                         transformers.PretrainedConfig]:
    """The config of the model Pagoda runs (a multimodal folder's text model's), and the
    folder's own."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(
            f"{folder} is not a model folder: it has no config.json. Pass a Hugging Face model "
            "folder (config.json, *.safetensors, tokenizer files) or a .gguf file."
        )
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(
            f"{config_file} is not readable JSON ({error}). Re-download the model."
        ) from error
    check_config_supported(raw, config_file)
    try:
        config = transformers.AutoConfig.from_pretrained(folder)
        text = text_model_config(config)
    except Exception as error:
        raise ModelLoadError(
            f"{config_file} could not be read as a model config: {error}. Re-download the model."
        ) from error
    if text is not config and config.model_type not in IMAGE_TOWERS:
        logger.info("%s is a %s folder: Pagoda runs its text model; its vision encoder and any "
                    "multi-token-prediction layers are not loaded (a chat with an image is "
                    "refused in words)", folder.name, config.model_type)
    return text, config


def _read_vision_weights(folder: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The image tower's and projector's tensors under the names its builder reads (which
    ones it needs, and their shapes, the builder checks)."""
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in _folder_tensors(folder):
        ours = vision_tensor_name(name)
        if ours is not None:
            weights[ours] = tensor().to(dtype)
    return weights


def _folder_tensors(folder: Path) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """Each tensor of the folder's weight files: its name, and what reads it (only what is
    read is loaded); ModelLoadError, from either, for a file cut short or damaged."""
    for file in _weight_files(folder):
        with _damage_named(file), safe_open(file, framework="pt") as tensors:
            for name in tensors.keys():
                yield name, functools.partial(_read_tensor, tensors, name, file)


def _read_tensor(tensors, name: str, file: Path) -> torch.Tensor:
    with _damage_named(file):
        return tensors.get_tensor(name)


@contextlib.contextmanager
def _damage_named(file: Path) -> Iterator[None]:
    try:
        yield
    except (SafetensorError, OSError) as error:
        raise ModelLoadError(
            f"Weight file {file} is truncated or corrupt ({error}). Re-download it."
        ) from error


def _read_tokenizer(
    folder: Path, config: transformers.PretrainedConfig
) -> transformers.PreTrainedTokenizerBase:
    hint = (
        "The folder needs the model's tokenizer files (tokenizer.json and tokenizer_config.json); "
        "re-download them."
    )
    # Without these transformers quietly builds an empty tokenizer instead of failing.
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)}). {hint}")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    except Exception as error:
        raise ModelLoadError(
            f"The tokenizer in {folder} failed to load: {error}. {hint}"
        ) from error
    if len(tokenizer) > config.vocab_size:
        raise ModelLoadError(
            f"The tokenizer in {folder} has {len(tokenizer)} tokens but the model's vocabulary "
            f"holds {config.vocab_size}: they belong to different models. {hint}"
        )
    if tokenizer.chat_template is None:
        logger.warning("%s has no chat template; chat prompts cannot be formatted", folder)
    return tokenizer


def _weight_files(folder: Path) -> list[Path]:
    index = folder / SHARD_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise ModelLoadError(
                f"{index} is not a valid shard index ({error}). Re-download the model."
            ) from error
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"{folder} has no weight files (*.safetensors). Pagoda reads safetensors only: "
            "download the safetensors version of the model, or pass a .gguf file."
        )
    for file in files:
        if not file.is_file():
            raise ModelLoadError(
                f"Weight file {file}, listed in {index}, is missing. Re-download the model."
            )
    return files


def _read_weights(
    folder: Path, config: transformers.PretrainedConfig, dtype: torch.dtype, mtp: bool
) -> dict[str, torch.Tensor]:
    """mtp: read the multi-token-prediction block's tensors (the optional ones) too."""
    expected = expected_weight_shapes(config)
    optional = optional_weight_shapes(config) if mtp else {}
    family = family_for_model_type(config.model_type)
    renamed = family.folder_tensor_pattern()  # names the family maps to the shared ones
    weights: dict[str, torch.Tensor] = {}
    own_names: dict[str, torch.Tensor] = {}
    extra: dict[str, torch.Tensor] = {}
    unread_mtp: list[str] = []
    for name, tensor in _folder_tensors(folder):
        if name in expected:
            weights[name] = tensor().to(dtype)
        elif name in optional:
            extra[name] = tensor().to(dtype)
        elif name.startswith(MTP_PREFIX):
            if mtp:
                unread_mtp.append(name)
        elif renamed is not None and renamed.fullmatch(name):
            own_names[name] = tensor().to(dtype)
    if own_names:
        weights |= family.folder_weights(config, own_names)
    _check_weights(weights, expected, folder)
    if extra:  # a multi-token-prediction block: all of it, or the folder is damaged
        _check_weights(extra, optional, folder)
    elif unread_mtp:
        logger.warning("%s has a multi-token-prediction block (%s, ...) in a layout Pagoda does "
                       "not read: speculative decoding drafts by prompt lookup alone",
                       folder.name, unread_mtp[0])
    return {name: weights[name] for name in expected} | extra


def _check_weights(
    weights: dict[str, Weight], expected: dict[str, tuple[int, ...]], folder: Path
) -> None:
    missing = [name for name in expected if name not in weights]
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise ModelLoadError(
            f"The weights in {folder} lack tensor {shown}. They do not match the folder's "
            "config.json; re-download the model."
        )
    for name, shape in expected.items():
        got = weight_shape(weights[name])
        if got != shape:
            raise ModelLoadError(
                f"Tensor {name} in {folder} has shape {got}, but config.json implies {shape}. "
                "The weights do not match the config; re-download the model."
            )
