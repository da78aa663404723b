"""Keyrings for the tests: one in memory, one that is there but fails on use."""

import keyring.errors


class FakeKeyring:
    """An in-memory keyring with the system keyring's calls and its refusal to delete nothing."""

    def __init__(self) -> None:
        self.passwords: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.passwords.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.passwords[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.passwords.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError("no such password")


class LockedKeyring(FakeKeyring):
    """A keyring that is there but fails on use (a locked or unreachable Secret Service)."""

    def get_password(self, service: str, username: str) -> str | None:
        raise keyring.errors.KeyringLocked("locked")

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.KeyringLocked("locked")
