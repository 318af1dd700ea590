"""The block file format: one llama.cpp sequence state, encrypted and bound to its identity.

Layout (all integers big-endian):

    MAGIC (8 bytes, b"GLHDKVB\\n")  FORMAT_VERSION (u16)
    header length (u32)  header (canonical JSON, UTF-8)        -- authenticated, not secret
    sealed length (u32)  sealed metadata (AES-GCM)             -- token hash and graft proof
    chunk*: length (u32)  AES-GCM ciphertext of one payload chunk

The header (block id, kind, owner, parent, positions, generation, runtime fingerprint, sizes)
is the additional data of every AES-GCM operation, together with the chunk index and a
last-chunk flag, so any edit, truncation, extension, reordering or swap of a file fails
authentication. The payload is encrypted in fixed-size chunks so a multi-GB state never needs
two copies in memory. Each block has its own random data key; the catalog holds it wrapped by
the master key, so rotating the master key never rewrites these files.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import errno
import functools
import hashlib
import json
import mmap
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from galahad_desktop.faults import crashpoint
from galahad_desktop.system.files import atomic_file

MAGIC = b"GLHDKVB\n"
FORMAT_VERSION = 1
CHUNK_BYTES = 4 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
_PREFIX = struct.Struct(">8sHI")
_U32 = struct.Struct(">I")
_TAG_BYTES = 16


class BlockFormatError(Exception):
    """The file is not a valid block file, or failed authentication. The message says why."""


@dataclass(frozen=True)
class BlockHeader:
    block_id: str
    kind: str  # "conversation" | "document"
    owner_id: str
    parent_id: str | None
    pos_start: int
    pos_end: int
    n_tokens: int
    generation: int
    fingerprint: str
    created_at: float
    payload_bytes: int
    chunk_bytes: int
    nonce_prefix: str  # 8 random bytes, hex; chunk nonce = prefix || u32 index

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> BlockHeader:
        try:
            fields = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise BlockFormatError("header is not valid JSON") from None
        if not isinstance(fields, dict) or set(fields) != set(_HEADER_TYPES):
            raise BlockFormatError("header does not have the expected fields")
        for name, kinds in _HEADER_TYPES.items():
            value = fields[name]
            # bool is an int in Python; a header never holds one.
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise BlockFormatError(f"header field '{name}' has the wrong type")
        return cls(**fields)

    @property
    def n_chunks(self) -> int:
        return max(1, -(-self.payload_bytes // self.chunk_bytes))


_HEADER_TYPES: dict[str, type | tuple[type, ...]] = {
    "block_id": str,
    "kind": str,
    "owner_id": str,
    "parent_id": (str, type(None)),
    "pos_start": int,
    "pos_end": int,
    "n_tokens": int,
    "generation": int,
    "fingerprint": str,
    "created_at": (int, float),
    "payload_bytes": int,
    "chunk_bytes": int,
    "nonce_prefix": str,
}


def open_block_file(path: Path) -> BinaryIO:
    """Open a block file for reading: never through a link, and only a regular file (a
    folder, a pipe or a device put in its place is refused, not waited on)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise BlockFormatError("is a link, not a block file; refused") from None
        if exc.errno == errno.EISDIR:
            raise BlockFormatError("is a folder, not a block file; refused") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BlockFormatError("is not a regular file; refused")
    return os.fdopen(fd, "rb")


def header_digest(header_bytes: bytes) -> str:
    return hashlib.sha256(header_bytes).hexdigest()


def _chunk_aad(digest: bytes, index: int, last: bool) -> bytes:
    return b"galahad-chunk/v1" + digest + struct.pack(">IB", index, 1 if last else 0)


def _sealed_aad(digest: bytes) -> bytes:
    return b"galahad-sealed/v1" + digest


def new_nonce_prefix() -> str:
    return os.urandom(8).hex()


def write_block(
    path: Path,
    header: BlockHeader,
    sealed_meta: dict[str, Any],
    data_key: bytes,
    payload: memoryview,
) -> tuple[str, int]:
    """Write a block file atomically; return (header digest, file size in bytes)."""
    if len(payload) != header.payload_bytes:
        raise ValueError("payload size does not match the header")
    header_bytes = header.to_bytes()
    digest = hashlib.sha256(header_bytes).digest()
    aead = AESGCM(data_key)
    prefix = bytes.fromhex(header.nonce_prefix)
    sealed_nonce = os.urandom(12)
    sealed = sealed_nonce + aead.encrypt(
        sealed_nonce, json.dumps(sealed_meta, sort_keys=True).encode("utf-8"), _sealed_aad(digest)
    )
    size = 0
    with atomic_file(path) as handle:
        for part in (
            _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes)),
            header_bytes,
            _U32.pack(len(sealed)),
            sealed,
        ):
            handle.write(part)
            size += len(part)
        n_chunks = header.n_chunks
        for index in range(n_chunks):
            chunk = payload[index * header.chunk_bytes : (index + 1) * header.chunk_bytes]
            nonce = prefix + struct.pack(">I", index)
            ciphertext = aead.encrypt(
                nonce, chunk, _chunk_aad(digest, index, index == n_chunks - 1)
            )
            handle.write(_U32.pack(len(ciphertext)))
            handle.write(ciphertext)
            size += _U32.size + len(ciphertext)
            crashpoint("block-write-midway")
    return digest.hex(), size


def _read_exact(handle: BinaryIO, n: int, what: str) -> bytes:
    data = handle.read(n)
    if len(data) != n:
        raise BlockFormatError(f"file is truncated (in the {what})")
    return data


def read_header(path: Path) -> tuple[BlockHeader, bytes]:
    """Read and parse the plaintext header (not yet authenticated: that needs the key)."""
    with open_block_file(path) as handle:
        return _read_header(handle)


def _read_header(handle: BinaryIO) -> tuple[BlockHeader, bytes]:
    magic, version, header_len = _PREFIX.unpack(_read_exact(handle, _PREFIX.size, "prefix"))
    if magic != MAGIC:
        raise BlockFormatError("not a Galahad block file (bad magic)")
    if version != FORMAT_VERSION:
        raise BlockFormatError(f"unsupported block format version {version}")
    if header_len > MAX_HEADER_BYTES:
        raise BlockFormatError("header length is out of range")
    raw = _read_exact(handle, header_len, "header")
    header = BlockHeader.from_bytes(raw)
    if (
        header.chunk_bytes <= 0
        or header.payload_bytes < 0
        or len(header.nonce_prefix) != 16
        or any(c not in "0123456789abcdef" for c in header.nonce_prefix)
    ):
        raise BlockFormatError("header fields are out of range")
    if hasattr(handle, "fileno") and header.payload_bytes > os.fstat(handle.fileno()).st_size:
        raise BlockFormatError("file is truncated (header claims more payload than it holds)")
    return header, raw


def _read_sealed_meta(handle: BinaryIO, aead: AESGCM, digest: bytes) -> dict[str, Any]:
    """The block's sealed metadata, after its header: bounded, then authenticated."""
    (sealed_len,) = _U32.unpack(_read_exact(handle, _U32.size, "sealed length"))
    if sealed_len > MAX_HEADER_BYTES + 12 + _TAG_BYTES or sealed_len < 12 + _TAG_BYTES:
        raise BlockFormatError("sealed metadata length is out of range")
    sealed = _read_exact(handle, sealed_len, "sealed metadata")
    try:
        meta_raw = aead.decrypt(sealed[:12], sealed[12:], _sealed_aad(digest))
    except InvalidTag:
        raise BlockFormatError("sealed metadata failed authentication") from None
    meta: dict[str, Any] = json.loads(meta_raw)
    return meta


def _chunk_places(
    data: memoryview, at: int, header: BlockHeader
) -> tuple[list[tuple[int, int, int]], int]:
    """Where each chunk's ciphertext starts, where its plaintext goes and how long it is,
    every length checked against the header before anything is decrypted; and the
    payload bytes they add up to."""
    size = len(data)
    places = []
    offset = 0
    for index in range(header.n_chunks):
        if at + _U32.size > size:
            raise BlockFormatError(f"file is truncated (in chunk {index} length)")
        (length,) = _U32.unpack(data[at : at + _U32.size])
        at += _U32.size
        plain_len = min(header.chunk_bytes, header.payload_bytes - offset)
        if length != plain_len + _TAG_BYTES:
            raise BlockFormatError(f"chunk {index} has the wrong length")
        if at + length > size:
            raise BlockFormatError(f"file is truncated (in chunk {index})")
        places.append((at, offset, plain_len))
        at += length
        offset += plain_len
    if at != size:
        raise BlockFormatError("file has extra bytes after the last chunk")
    return places, offset


_PARALLEL_CHUNKS = 4  # 16 MB and up: below that a thread hand-off costs more than it saves


@functools.lru_cache(maxsize=1)
def _decryptors() -> concurrent.futures.ThreadPoolExecutor:
    workers = max(1, min(4, os.cpu_count() or 1))
    return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="decrypt")


def read_block(
    path: Path,
    data_key: bytes,
    expected_digest: str,
    keep_payload: bool = True,
    buffer_for: Callable[[int], ctypes.Array[ctypes.c_uint8]] | None = None,
) -> tuple[BlockHeader, dict[str, Any], ctypes.Array[ctypes.c_uint8] | None]:
    """Authenticate and decrypt a whole block into one buffer ready for llama.cpp.

    Nothing is returned unless every chunk authenticated, so a modified file never reaches
    llama.cpp. The payload is decrypted chunk by chunk into a single preallocated buffer;
    with keep_payload=False (the audit) chunks are authenticated and dropped. `buffer_for(n)`
    may supply a reusable buffer of at least n bytes (the payload fills its first n bytes).
    """
    with open_block_file(path) as handle:
        header, raw = _read_header(handle)
        digest_hex = header_digest(raw)
        if digest_hex != expected_digest:
            raise BlockFormatError("header does not match the catalog (swapped or rolled back)")
        digest = bytes.fromhex(digest_hex)
        aead = AESGCM(data_key)
        meta = _read_sealed_meta(handle, aead, digest)
        payload = None
        if keep_payload:
            payload = (
                buffer_for(header.payload_bytes)
                if buffer_for is not None
                else (ctypes.c_uint8 * header.payload_bytes)()
            )
        view = memoryview(payload).cast("B") if payload is not None else None
        prefix = bytes.fromhex(header.nonce_prefix)
        plain_max = min(header.chunk_bytes, max(header.payload_bytes, 0))
        # The chunks are decrypted straight out of the page cache (a read-only map): no
        # copy into a read buffer first, which cost as much as the decryption itself.
        with contextlib.ExitStack() as stack:  # the header was read: the file is not empty
            mapped = stack.enter_context(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
            data = memoryview(mapped)
            stack.callback(data.release)
            chunks, offset = _chunk_places(data, handle.tell(), header)
            scratch = memoryview(bytearray(plain_max)) if view is None else None

            def decrypt(index: int) -> None:
                at, plain_at, plain_len = chunks[index]
                target = view if view is not None else scratch
                assert target is not None
                into = (
                    target[plain_at : plain_at + plain_len]
                    if view is not None
                    else target[:plain_len]
                )
                nonce = prefix + struct.pack(">I", index)
                aad = _chunk_aad(digest, index, index == len(chunks) - 1)
                with data[at : at + plain_len + _TAG_BYTES] as chunk:
                    try:
                        # Decrypted straight into the buffer llama.cpp will read: no extra
                        # copy. On a failed tag the whole buffer is dropped, never used.
                        aead.decrypt_into(nonce, chunk, aad, into)
                    except InvalidTag:
                        raise BlockFormatError(f"chunk {index} failed authentication") from None

            if len(chunks) >= _PARALLEL_CHUNKS and view is not None:
                # AES-GCM leaves Python's lock while it works: at real Gemma 4 sizes (a
                # 250 MB block) two cores decrypt a block in ~60% of one core's time.
                # Every chunk is waited for (the map is closed after), then the first
                # failure, in chunk order, is raised.
                jobs = [_decryptors().submit(decrypt, i) for i in range(len(chunks))]
                concurrent.futures.wait(jobs)
                for job in jobs:
                    job.result()
            else:
                for index in range(len(chunks)):
                    decrypt(index)
    if offset != header.payload_bytes:
        raise BlockFormatError("payload is shorter than the header says")
    return header, meta, payload
