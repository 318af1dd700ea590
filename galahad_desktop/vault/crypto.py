"""AES-256-GCM helpers: key wrapping and field encryption with bound context (AAD).

Every ciphertext carries a one-byte scheme version so the format can evolve. The AAD binds a
ciphertext to where it belongs (table, column, row id; block id and owner), so moving a value
to another row or another block makes decryption fail instead of returning someone else's data.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from galahad_desktop.errors import AUDIT, IntegrityError

KEY_BYTES = 32
NONCE_BYTES = 12
SCHEME_V1 = b"\x01"


class DecryptionFailed(IntegrityError):
    """A ciphertext did not authenticate under the given key and context (exit 5)."""


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return SCHEME_V1 + nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    if not isinstance(sealed, bytes | bytearray | memoryview):
        raise DecryptionFailed("missing or not a ciphertext")
    if len(sealed) < 1 + NONCE_BYTES + 16 or sealed[:1] != SCHEME_V1:
        raise DecryptionFailed("malformed ciphertext")
    nonce = sealed[1 : 1 + NONCE_BYTES]
    try:
        return AESGCM(key).decrypt(nonce, sealed[1 + NONCE_BYTES :], aad)
    except InvalidTag:
        raise DecryptionFailed("authentication failed") from None


def field_aad(table: str, column: str, row_id: str) -> bytes:
    return f"galahad-field/v1/{table}/{column}/{row_id}".encode()


def key_wrap_aad(block_id: str, owner_id: str) -> bytes:
    return f"galahad-block-key/v1/{block_id}/{owner_id}".encode()


class FieldCipher:
    """Encrypts catalog fields (text and blobs) under the catalog data key, and computes
    keyed lookup tags (HMAC under a subkey) so equal values can be found without storing
    them in plain text."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._mac_key = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=b"galahad-lookup-mac/v1"
        ).derive(key)

    def lookup_tag(self, value: str, purpose: str) -> str:
        mac = hmac.HMAC(self._mac_key, hashes.SHA256())
        mac.update(f"{purpose}\0{value}".encode())
        return mac.finalize().hex()

    def encrypt_text(self, text: str, table: str, column: str, row_id: str) -> bytes:
        return seal(self._key, text.encode("utf-8"), field_aad(table, column, row_id))

    def decrypt_text(self, blob: object, table: str, column: str, row_id: str) -> str:
        raw = self.decrypt_bytes(blob, table, column, row_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DecryptionFailed(damaged(table, column, row_id), **AUDIT) from None

    def encrypt_bytes(self, data: bytes, table: str, column: str, row_id: str) -> bytes:
        return seal(self._key, data, field_aad(table, column, row_id))

    def decrypt_bytes(self, blob: object, table: str, column: str, row_id: str) -> bytes:
        if not isinstance(blob, bytes):  # a catalog cell edited to another type
            raise DecryptionFailed(damaged(table, column, row_id), **AUDIT)
        try:
            return open_sealed(self._key, blob, field_aad(table, column, row_id))
        except DecryptionFailed:
            raise DecryptionFailed(damaged(table, column, row_id), **AUDIT) from None


def damaged(table: str, column: str, row_id: object) -> str:
    """The message for a catalog field that failed authentication: which record, which field."""
    what = {
        "conversations": "conversation",
        "messages": "message",
        "documents": "document",
        "parts": "document part",
        "verified": "verified answer",
        "blocks": "block",
        "routing_log": "routing-log line",
        "usage": "usage line",
        "part_vectors": "passage vectors",
        "reply_versions": "reply version",
        "prompts": "shared system prompt",
        "api_prefixes": "API history entry",
    }.get(table, table)
    field = column.removesuffix("_enc")
    row_id = str(row_id).split("|")[0]  # a message's context starts with its id
    return (
        f"The {field} of {what} {row_id} in the catalog is damaged or was edited (it failed "
        "authentication); refused."
    )
