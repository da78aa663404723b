"""The models opened from a file outside the models folder ("Open model file…"), and the bundled
one, with when each was last loaded. They belong to this computer, not to a chats database, so
they are kept in the app's config folder (OPENED_FILE), not in the store. Read and written on
`LocalModels`' thread only."""

from __future__ import annotations

import logging
from pathlib import Path

from pagoda.app.components.shared.config_folder import config_dir
from pagoda.app.components.shared.times_file import read_times, write_times

logger = logging.getLogger(__name__)

OPENED_FILE = "opened-models.json"
# The most remembered; the least recently loaded are forgotten first. Bounds the file, which
# anyone who can write the config folder controls.
MAX_REMEMBERED = 64


class OpenedModels:
    """{absolute path: when it was last loaded} in `file`. Paths are kept as opened (a
    symbolic link stays one), so the picker shows them as the user chose them."""

    def __init__(self, file: Path) -> None:
        self.file = file

    @classmethod
    def default(cls) -> OpenedModels:
        return cls(config_dir() / OPENED_FILE)

    def read(self) -> dict[Path, float]:
        newest = sorted(read_times(self.file).items(), key=lambda kv: kv[1], reverse=True)
        return {Path(path): when for path, when in newest[:MAX_REMEMBERED]}

    def note(self, model: Path, when: float) -> None:
        times = {str(path): used for path, used in self.read().items()}
        times[str(model.absolute())] = when
        try:
            write_times(self.file, dict(sorted(times.items(), key=lambda kv: kv[1])
                                        [-MAX_REMEMBERED:]))
        except OSError as error:  # a read-only config folder: the model still loads
            logger.warning("could not note %s in %s: %s", model, self.file, error)

    def forget(self, model: Path) -> None:
        """Raises OSError when the file cannot be written (the caller says so)."""
        times = {str(path): used for path, used in self.read().items()}
        if times.pop(str(model.absolute()), None) is not None:
            write_times(self.file, times)
