"""Where the master key lives: the OS keyring (Secret Service, Keychain, Credential Locker).

The master key never touches a file or a log. Each data directory (vault) has its own id, and
each master key its own key id, so rotation can hold the old and the new key side by side
until the catalog has switched over.
"""

from __future__ import annotations

import base64
import binascii
from typing import Protocol

from galahad_desktop.errors import KeyAccessError

SERVICE = "galahad-desktop"


def entry_name(vault_id: str, key_id: str) -> str:
    return f"master-key/{vault_id}/{key_id}"


class KeyStore(Protocol):
    """Storage for master keys; implementations raise KeyAccessError with a user message."""

    @property
    def backend_name(self) -> str: ...

    def get(self, name: str) -> bytes | None: ...

    def put(self, name: str, key: bytes) -> None: ...

    def delete(self, name: str) -> None: ...


class KeyringKeyStore:
    """The OS keyring through the `keyring` library."""

    def __init__(self) -> None:
        import keyring
        from keyring.backends import fail

        backend = keyring.get_keyring()
        chainer_backends = getattr(backend, "backends", None)
        if isinstance(backend, fail.Keyring) or chainer_backends == []:
            raise KeyAccessError(
                "No usable OS keyring was found, so the master key cannot be stored safely. "
                "Install and unlock a Secret Service provider (for example gnome-keyring or "
                "KWallet), then try again. Nothing was written."
            )
        self._keyring = keyring
        self._backend = backend

    @property
    def backend_name(self) -> str:
        backend = self._backend
        return f"{type(backend).__module__}.{type(backend).__name__}"

    def _fail(self, action: str, exc: Exception) -> KeyAccessError:
        return KeyAccessError(
            f"The OS keyring ({self.backend_name}) refused to {action} the master key: "
            f"{type(exc).__name__}: {exc}. Unlock the keyring and try again."
        )

    def get(self, name: str) -> bytes | None:
        try:
            value = self._keyring.get_password(SERVICE, name)
        except Exception as exc:  # keyring backends raise many unrelated types
            raise self._fail("read", exc) from None
        if value is None:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            raise KeyAccessError(
                f"The keyring entry '{SERVICE} / {name}' is not a Galahad master key."
            ) from None

    def put(self, name: str, key: bytes) -> None:
        try:
            self._keyring.set_password(SERVICE, name, base64.b64encode(key).decode("ascii"))
        except Exception as exc:
            raise self._fail("store", exc) from None
        if self.get(name) != key:
            raise KeyAccessError(
                f"The OS keyring ({self.backend_name}) did not keep the master key it was given."
            )

    def delete(self, name: str) -> None:
        try:
            self._keyring.delete_password(SERVICE, name)
        except self._keyring.errors.PasswordDeleteError:
            pass  # already gone
        except Exception as exc:
            raise self._fail("delete", exc) from None


class MemoryKeyStore:
    """A keystore in process memory, for fast unit tests only."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    @property
    def backend_name(self) -> str:
        return "memory (tests only)"

    def get(self, name: str) -> bytes | None:
        return self.entries.get(name)

    def put(self, name: str, key: bytes) -> None:
        self.entries[name] = key

    def delete(self, name: str) -> None:
        self.entries.pop(name, None)
