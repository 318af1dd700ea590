"""Block file format: round trip, and every kind of modification refused before use."""

from __future__ import annotations

import ctypes
import os
import random
from pathlib import Path

import pytest

from galahad_desktop.vault import blockfile, crypto


def _header(
    payload_bytes: int, chunk_bytes: int = 1000, **changes: object
) -> blockfile.BlockHeader:
    fields = dict(
        block_id="b-1",
        kind="conversation",
        owner_id="c-1",
        parent_id=None,
        pos_start=0,
        pos_end=10,
        n_tokens=10,
        generation=1,
        fingerprint="f" * 64,
        created_at=1.0,
        payload_bytes=payload_bytes,
        chunk_bytes=chunk_bytes,
        nonce_prefix=blockfile.new_nonce_prefix(),
    )
    fields.update(changes)
    return blockfile.BlockHeader(**fields)  # type: ignore[arg-type]


@pytest.fixture()
def written(tmp_path: Path) -> tuple[Path, bytes, bytes, str]:
    payload = os.urandom(3500)  # four chunks of 1000, the last partial
    key = crypto.new_key()
    path = tmp_path / "b-1.gkv"
    digest, size = blockfile.write_block(
        path, _header(len(payload)), {"tokens_sha256": "x"}, key, memoryview(payload)
    )
    assert size == path.stat().st_size
    return path, payload, key, digest


def test_round_trip(written: tuple[Path, bytes, bytes, str]) -> None:
    path, payload, key, digest = written
    header, meta, buf = blockfile.read_block(path, key, digest)
    assert buf is not None and bytes(buf) == payload
    assert meta == {"tokens_sha256": "x"}
    assert header.owner_id == "c-1" and header.n_chunks == 4
    assert path.read_bytes().startswith(blockfile.MAGIC)
    assert payload not in path.read_bytes() and payload[:64] not in path.read_bytes()
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_every_flipped_byte_is_refused(written: tuple[Path, bytes, bytes, str]) -> None:
    path, _payload, key, digest = written
    original = path.read_bytes()
    rng = random.Random(7)
    positions = sorted(
        {
            *range(0, 64),
            *range(len(original) - 64, len(original)),
            *(rng.randrange(len(original)) for _ in range(300)),
        }
    )
    for pos in positions:
        mutated = bytearray(original)
        mutated[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(mutated))
        with pytest.raises(blockfile.BlockFormatError):
            blockfile.read_block(path, key, digest)
    path.write_bytes(original)
    blockfile.read_block(path, key, digest)  # the untouched file still opens


@pytest.mark.parametrize("cut", [1, 17, 1016, 2000])
def test_truncation_and_extension_are_refused(
    written: tuple[Path, bytes, bytes, str], cut: int
) -> None:
    path, _payload, key, digest = written
    original = path.read_bytes()
    path.write_bytes(original[:-cut])
    with pytest.raises(blockfile.BlockFormatError, match=r"truncated|length"):
        blockfile.read_block(path, key, digest)
    path.write_bytes(original + b"\0" * cut)
    with pytest.raises(blockfile.BlockFormatError, match="extra bytes"):
        blockfile.read_block(path, key, digest)


def test_wrong_key_and_swapped_header_are_refused(
    written: tuple[Path, bytes, bytes, str], tmp_path: Path
) -> None:
    path, payload, key, digest = written
    with pytest.raises(blockfile.BlockFormatError, match="authentication"):
        blockfile.read_block(path, crypto.new_key(), digest)
    # A block of another owner, same key and payload: the catalog's header digest differs.
    other = tmp_path / "other.gkv"
    other_digest, _ = blockfile.write_block(
        other, _header(len(payload), owner_id="c-2"), {}, key, memoryview(payload)
    )
    with pytest.raises(blockfile.BlockFormatError, match="does not match the catalog"):
        blockfile.read_block(other, key, digest)
    # Chunks of one file spliced behind another file's header fail authentication.
    header_len = len(_header(len(payload)).to_bytes())
    spliced = other.read_bytes()[: 14 + header_len] + path.read_bytes()[14 + header_len :]
    other.write_bytes(spliced)
    with pytest.raises(blockfile.BlockFormatError):
        blockfile.read_block(other, key, other_digest)


def test_not_a_block_file(tmp_path: Path) -> None:
    path = tmp_path / "x.gkv"
    path.write_bytes(b"hello world, definitely not a block")
    with pytest.raises(blockfile.BlockFormatError, match="magic"):
        blockfile.read_header(path)


def test_payload_buffer_is_ready_for_ctypes(written: tuple[Path, bytes, bytes, str]) -> None:
    path, payload, key, digest = written
    _h, _m, buf = blockfile.read_block(path, key, digest)
    assert isinstance(buf, ctypes.Array) and ctypes.sizeof(buf) == len(payload)


def test_chunks_decrypted_on_several_threads_name_the_first_bad_one(tmp_path: Path) -> None:
    payload = os.urandom(12_345)  # 13 chunks: decrypted in parallel into one buffer
    key = crypto.new_key()
    path = tmp_path / "b-1.gkv"
    digest, _size = blockfile.write_block(path, _header(len(payload)), {}, key, memoryview(payload))
    _head, _meta, buf = blockfile.read_block(path, key, digest)
    assert buf is not None and bytes(buf) == payload
    original = path.read_bytes()
    mutated = bytearray(original)
    record = 4 + 1000 + 16  # length, ciphertext, tag
    first = len(original) - 12 * record - (4 + 345 + 16)
    for index in (9, 4):  # two bad chunks: the earlier one is named
        mutated[first + index * record + 4 + 20] ^= 0x40
    path.write_bytes(bytes(mutated))
    for keep in (True, False):  # a restore and the audit
        with pytest.raises(blockfile.BlockFormatError, match="chunk 4 failed authentication"):
            blockfile.read_block(path, key, digest, keep_payload=keep)
