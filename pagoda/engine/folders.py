"""Where Pagoda keeps things on disk: downloaded models, caches (converted metadata, built
kernels), the prefix cache's blocks. Each is overridable by an environment variable."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_DIR_ENV_VAR = "PAGODA_CACHE_DIR"
DISK_KV_CACHE_ENV_VAR = "PAGODA_KV_CACHE_DIR"
MODELS_DIR_ENV_VAR = "PAGODA_MODELS_DIR"


def cache_dir() -> Path:
    """$PAGODA_CACHE_DIR, else the user's cache folder for Pagoda."""
    override = os.environ.get(CACHE_DIR_ENV_VAR)
    return Path(override) if override else Path(platformdirs.user_cache_dir("pagoda"))


def disk_kv_cache_dir() -> Path:
    """Where the app keeps the prefix cache's blocks across restarts: $PAGODA_KV_CACHE_DIR, else
    kv-blocks in the cache folder."""
    override = os.environ.get(DISK_KV_CACHE_ENV_VAR)
    return Path(override) if override else cache_dir() / "kv-blocks"


def default_models_dir() -> Path:
    """Where downloaded models go by default: $PAGODA_MODELS_DIR, else a models folder in the
    user's data folder for Pagoda."""
    override = os.environ.get(MODELS_DIR_ENV_VAR)
    return Path(override) if override else Path(platformdirs.user_data_dir("pagoda")) / "models"
