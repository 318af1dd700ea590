"""Where the master key lives: the OS keyring (Secret Service, Keychain, Credential Locker).

The master key never touches a file or a log. Each data directory (vault) has its own id, and
each master key its own key id, so rotation can hold the old and the new key side by side
until the catalog has switched over.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from galahad_desktop.errors import KeyAccessError

SERVICE = "galahad-desktop"


def entry_name(vault_id: str, key_id: str) -> str:
    return f"master-key/{vault_id}/{key_id}"


def api_key_entry(vault_id: str) -> str:
    """The keyring entry of the local API server's bearer key, beside the master key."""
    return f"api-key/{vault_id}"


# scrypt cost bounds: below, a stolen file is cheap to attack; above, opening takes minutes
# or more memory than a desktop has (a file edited to make every open hang).
SCRYPT_N_RANGE = (2**14, 2**20)
SCRYPT_R_RANGE = (8, 16)
SCRYPT_P_RANGE = (1, 4)


def check_scrypt_params(params: Any, where: str) -> None:
    """Refuse scrypt parameters that are missing, of the wrong type, weak or absurd."""
    ok = isinstance(params, dict)
    for name, (low, high) in (("n", SCRYPT_N_RANGE), ("r", SCRYPT_R_RANGE), ("p", SCRYPT_P_RANGE)):
        value = params.get(name) if ok else None
        ok = ok and isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    n = params.get("n") if ok else 0
    ok = ok and n & (n - 1) == 0  # a power of two
    try:
        ok = ok and len(base64.b64decode(params["salt"], validate=True)) >= 16
    except (KeyError, TypeError, binascii.Error):
        ok = False
    if not ok:
        raise KeyAccessError(
            f"The key-derivation parameters in {where} are missing, weak or out of range; "
            "refused (the file was edited)."
        )


def _call_with_timeout(action: Any, timeout_s: float) -> Any:
    """Run a keyring call with a deadline: a Secret Service that does not answer must not
    hang the app (nor hold the data directory's lock) for minutes."""
    import threading

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = action()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="galahad-keyring", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def keyring_timeout_s() -> float:
    try:
        return max(0.1, float(os.environ.get("GALAHAD_KEYRING_TIMEOUT_S", "20")))
    except ValueError:
        return 20.0


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
        if isinstance(exc, TimeoutError):
            return KeyAccessError(
                f"The OS keyring ({self.backend_name}) did not answer a request to {action} "
                f"the master key ({exc}). Unlock or restart the keyring service and try again; "
                "nothing was changed."
            )
        return KeyAccessError(
            f"The OS keyring ({self.backend_name}) refused to {action} the master key: "
            f"{type(exc).__name__}: {exc}. Unlock the keyring and try again."
        )

    def get(self, name: str) -> bytes | None:
        try:
            value = _call_with_timeout(
                lambda: self._keyring.get_password(SERVICE, name), keyring_timeout_s()
            )
        except Exception as exc:  # keyring backends raise many unrelated types
            raise self._fail("read", exc) from None
        if value is not None and not isinstance(value, str):
            raise KeyAccessError(f"The keyring entry '{SERVICE} / {name}' is not text.")
        if value is None:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            raise KeyAccessError(
                f"The keyring entry '{SERVICE} / {name}' is not a Galahad master key."
            ) from None

    def put(self, name: str, key: bytes) -> None:
        encoded = base64.b64encode(key).decode("ascii")
        try:
            _call_with_timeout(
                lambda: self._keyring.set_password(SERVICE, name, encoded), keyring_timeout_s()
            )
        except Exception as exc:
            raise self._fail("store", exc) from None
        if self.get(name) != key:
            raise KeyAccessError(
                f"The OS keyring ({self.backend_name}) did not keep the master key it was given."
            )

    def delete(self, name: str) -> None:
        try:
            _call_with_timeout(
                lambda: self._keyring.delete_password(SERVICE, name), keyring_timeout_s()
            )
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


class PassphraseKeyStore:
    """For machines without a keyring: master keys wrapped (AES-256-GCM) under a key derived
    from a passphrase with scrypt, in `<data dir>/passphrase-keys.json`. The passphrase is
    never stored; a wrong one fails the key check before anything else is read."""

    FILE_NAME = "passphrase-keys.json"
    SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1

    def __init__(self, data_dir: Path, passphrase: str) -> None:
        if len(passphrase) < 8:
            raise KeyAccessError("The passphrase must be at least 8 characters long.")
        self.path = Path(data_dir) / self.FILE_NAME
        creating = not self.path.exists()
        if creating and len(set(passphrase)) < 4:
            raise KeyAccessError(
                "That passphrase is too easy to guess (fewer than 4 different characters); "
                "choose another."
            )
        self._state = self._load()
        salt = base64.b64decode(self._state["salt"])
        self._kek = Scrypt(
            salt=salt, length=32, n=self._state["n"], r=self._state["r"], p=self._state["p"]
        ).derive(passphrase.encode("utf-8"))
        check = self._state.get("check")
        if check is None:
            self._state["check"] = self._seal(b"galahad-passphrase-check", self._check_name())
            self._save()
        else:
            try:
                self._open_check(check)
            except (InvalidTag, ValueError, binascii.Error):
                raise KeyAccessError(
                    "The passphrase is wrong (or the key file's parameters were edited): it "
                    "does not open this data directory. Nothing was read or changed."
                ) from None

    def _open_check(self, check: str) -> None:
        try:
            self._open(check, self._check_name())
        except InvalidTag:
            # A file from before the parameters were bound: its check opens with the key
            # those same parameters derive, which proves them too. Bind them now.
            self._open(check, "check")
            self._state["check"] = self._seal(b"galahad-passphrase-check", self._check_name())
            self._save()

    def _check_name(self) -> str:
        """The check value's associated data binds the salt and scrypt parameters: a file
        edited to weaker ones fails the check, whatever the passphrase."""
        s = self._state
        return f"check/{s['n']}/{s['r']}/{s['p']}/{s['salt']}"

    @property
    def backend_name(self) -> str:
        return "passphrase (scrypt)"

    def _load(self) -> dict[str, Any]:
        if self.path.exists():
            try:
                state = json.loads(self.path.read_bytes())
            except OSError as exc:
                raise KeyAccessError(f"{self.path} cannot be read: {exc.strerror}.") from None
            except (ValueError, RecursionError):
                raise KeyAccessError(f"{self.path} is damaged (not valid JSON).") from None
            check_scrypt_params(state, str(self.path))
            entries = state.get("entries")
            if (
                not isinstance(entries, dict)
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items())
                or not isinstance(state.get("check", ""), str)
            ):
                raise KeyAccessError(f"{self.path} is damaged (its key entries are malformed).")
            return dict(state)
        return {
            "salt": base64.b64encode(os.urandom(16)).decode(),
            "n": self.SCRYPT_N,
            "r": self.SCRYPT_R,
            "p": self.SCRYPT_P,
            "entries": {},
        }

    def _save(self) -> None:
        from galahad_desktop.system.files import atomic_write_bytes

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_bytes(self.path, json.dumps(self._state, indent=1).encode("utf-8"))

    def _seal(self, data: bytes, name: str) -> str:
        nonce = os.urandom(12)
        sealed = nonce + AESGCM(self._kek).encrypt(nonce, data, name.encode())
        return base64.b64encode(sealed).decode()

    def _open(self, blob: str, name: str) -> bytes:
        raw = base64.b64decode(blob, validate=True)
        if len(raw) < 12 + 16:
            raise ValueError("too short")
        return AESGCM(self._kek).decrypt(raw[:12], raw[12:], name.encode())

    def get(self, name: str) -> bytes | None:
        blob = self._state["entries"].get(name)
        if blob is None:
            return None
        try:
            return self._open(blob, name)
        except (InvalidTag, ValueError, binascii.Error):
            raise KeyAccessError(f"The stored key '{name}' failed authentication.") from None

    def put(self, name: str, key: bytes) -> None:
        self._state["entries"][name] = self._seal(key, name)
        self._save()

    def delete(self, name: str) -> None:
        if self._state["entries"].pop(name, None) is not None:
            self._save()


def keystore_mode_file(data_dir: Path) -> Path:
    return Path(data_dir) / PassphraseKeyStore.FILE_NAME


def open_keystore(data_dir: Path, passphrase: str | None) -> KeyStore:
    """The keystore a data directory uses: passphrase mode once chosen, else the OS keyring."""
    has_catalog = (Path(data_dir) / "catalog.sqlite").exists()
    if passphrase is not None and has_catalog and not keystore_mode_file(data_dir).exists():
        raise KeyAccessError(
            f"{data_dir} keeps its key in the OS keyring, not under a passphrase; drop "
            "--passphrase (and GALAHAD_PASSPHRASE). To move it to a passphrase: export a "
            "recovery kit (galahad keys export), then create a passphrase directory and "
            "import your conversations into it."
        )
    if keystore_mode_file(data_dir).exists() or passphrase is not None:
        if passphrase is None:
            raise KeyAccessError(
                f"{data_dir} is protected by a passphrase: give it with --passphrase "
                "(or GALAHAD_PASSPHRASE)."
            )
        return PassphraseKeyStore(data_dir, passphrase)
    return KeyringKeyStore()


@dataclass(frozen=True)
class KeyStorage:
    """How a data directory's master key is (or would be) kept."""

    mode: Literal["keyring", "passphrase", "unavailable"]
    problem: str = ""  # for "unavailable": why the OS keyring cannot be used


def key_storage(data_dir: Path) -> KeyStorage:
    """How a data directory's key would be kept: in the OS keyring, under a passphrase
    (its keystore file says so), or nowhere yet (the keyring is unavailable, and why)."""
    if keystore_mode_file(data_dir).exists():
        return KeyStorage("passphrase")
    try:
        KeyringKeyStore()
    except KeyAccessError as exc:
        return KeyStorage("unavailable", str(exc))
    return KeyStorage("keyring")
