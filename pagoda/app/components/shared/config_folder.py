"""The user's config folder for Pagoda: what belongs to this computer rather than to a chats
database (the local server's key, the models opened from files, the window's layout)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CONFIG_DIR_ENV_VAR = "PAGODA_CONFIG_DIR"


def config_dir() -> Path:
    """$PAGODA_CONFIG_DIR, else the user's config folder for Pagoda."""
    override = os.environ.get(CONFIG_DIR_ENV_VAR)
    return Path(override) if override else platformdirs.user_config_path("pagoda",
                                                                         appauthor=False)
