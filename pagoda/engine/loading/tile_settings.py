"""SmolVLM's image processor settings (pagoda/engine/models/vision_tower.py's TileSettings), from
a folder's preprocessor_config.json or an mmproj file's keys, bounded before any image is
resized by them: a longest edge past transformers' own cap (4,096 pixels), or of more than 8
tiles (the released models: 4), would make an image of hundreds of tiles."""

from __future__ import annotations

import json
from pathlib import Path

from pagoda.engine.errors import ModelLoadError
from pagoda.engine.models.vision_tower import MAX_LONGEST_EDGE, TileSettings

PREPROCESSOR_CONFIG = "preprocessor_config.json"
# The most tiles a longest edge may span: 8 x 8 and the whole image, 65 tiles an image at most.
MAX_TILES_PER_EDGE = 8
# PIL's filters by number (Image.Resampling), as processors store them.
_PIL_FILTERS = range(6)


def folder_tile_settings(folder: Path, tile: int) -> TileSettings:
    """The folder's processor settings for a tower of `tile` pixels a side; ModelLoadError
    naming the setting where one is missing, damaged or not what Pagoda runs."""
    path = folder / PREPROCESSOR_CONFIG
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"{path} is missing or not readable JSON ({error}): SmolVLM's "
                             "images need its processor's settings. Re-download the model.") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path} is not an object of settings. Re-download the model.")
    tile_edge = _longest_edge(raw.get("max_image_size"), "max_image_size", path)
    if tile_edge != tile:
        raise ModelLoadError(f"{path}'s max_image_size is {tile_edge} pixels, where the vision "
                             f"tower's tiles are {tile}: Pagoda cuts tiles of the tower's side.")
    split = raw.get("do_image_splitting", True)
    resample = raw.get("resample", 1)
    if not isinstance(split, bool) or resample not in _PIL_FILTERS:
        raise ModelLoadError(f"{path}'s do_image_splitting {split!r} or resample {resample!r} "
                             "is not a setting SmolVLM's processor takes. Re-download the model.")
    return tile_settings(_longest_edge(raw.get("size"), "size", path), tile, str(path),
                         split=split, mean=raw.get("image_mean", [0.5] * 3),
                         std=raw.get("image_std", [0.5] * 3), resample=resample)


def tile_settings(longest_edge: object, tile: int, where: str, split: bool = True,
                  mean: object = (0.5, 0.5, 0.5), std: object = (0.5, 0.5, 0.5),
                  resample: int = 1) -> TileSettings:
    """The settings, checked: a longest edge of 1 to MAX_LONGEST_EDGE pixels and at most
    MAX_TILES_PER_EDGE tiles, three means and three standard deviations (none zero)."""
    most = min(MAX_LONGEST_EDGE, MAX_TILES_PER_EDGE * tile)
    if not isinstance(longest_edge, int) or not 0 < longest_edge <= most:
        raise ModelLoadError(f"{where} resizes images to a longest edge of {longest_edge!r} "
                             f"pixels, where 1 to {most} is taken (at most "
                             f"{MAX_TILES_PER_EDGE} tiles of {tile}, {MAX_LONGEST_EDGE} pixels).")
    if not (_three_numbers(mean) and _three_numbers(std) and all(s != 0 for s in std)):
        raise ModelLoadError(f"{where}'s image mean {mean!r} or standard deviation {std!r} is "
                             "not three numbers (the deviations not zero). Re-download the model.")
    return TileSettings(longest_edge, split, tuple(float(m) for m in mean),
                        tuple(float(s) for s in std), resample)


def _longest_edge(value: object, key: str, path: Path) -> object:
    if not isinstance(value, dict) or "longest_edge" not in value:
        raise ModelLoadError(f"{path} has no {key}.longest_edge, which SmolVLM's processor "
                             "resizes images by. Re-download the model.")
    return value["longest_edge"]


def _three_numbers(values: object) -> bool:
    return (isinstance(values, (list, tuple)) and len(values) == 3
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values))
