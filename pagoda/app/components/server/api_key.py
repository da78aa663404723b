"""The local server's API key: made on request and shown once; Pagoda keeps only its SHA-256, in
a file of the user's config folder that only they can read, never in the chats database."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from pagoda.app.backends.services.openai_server import key_digest
from pagoda.app.components.shared.config_folder import config_dir

KEY_PREFIX = "sk-pagoda-"
KEY_FILENAME = "api_key.sha256"
_DIGEST = re.compile(r"[0-9a-f]{64}")


class ApiKeyError(Exception):
    """The key's file cannot be read or written."""


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKeyFile:
    """The digest of the current key, or no file when no key is set."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def default(cls) -> ApiKeyFile:
        return cls(config_dir() / KEY_FILENAME)

    def is_set(self) -> bool:
        return self.path.exists()

    def digest(self) -> str | None:
        """The key's SHA-256 in hex, or None when no key is set."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as error:
            raise ApiKeyError(f"cannot read the API key's file {self.path} ({error}): "
                              "remove the key or generate a new one in Settings") from error
        if not _DIGEST.fullmatch(text):
            raise ApiKeyError(f"the API key's file {self.path} is damaged: remove the key or "
                              "generate a new one in Settings")
        return text

    def replace(self) -> str:
        """Make a new key, keep its digest (readable by this user only), return the key. Off
        the GUI thread: the server's module that digests keys imports fastapi."""
        key = new_api_key()
        self._write(key_digest(key))
        return key

    def remove(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as error:
            raise ApiKeyError(f"cannot remove the API key's file {self.path} "
                              f"({error.strerror})") from error

    def _write(self, digest: str) -> None:
        partial = self.path.with_name(self.path.name + ".new")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as file:
                os.chmod(partial, 0o600)  # O_CREAT's mode is ignored for a file left behind
                file.write(digest + "\n")
            os.replace(partial, self.path)
        except OSError as error:
            raise ApiKeyError(f"cannot save the API key in {self.path} "
                              f"({error.strerror})") from error
