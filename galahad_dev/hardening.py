"""Hardening evaluations: a seeded tamper fuzzer over block files and the catalog, and
crash trials that SIGKILL real `galahad` processes at random moments.

`python -m galahad_dev eval tamper` and `… eval crashes` print the figures recorded in
docs/reliability.md; the test suite runs them too (crash trials scaled down).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from galahad_desktop.errors import GalahadError, IntegrityError
from galahad_desktop.jobs import Job
from galahad_desktop.vault import blockfile
from galahad_desktop.vault.keys import MemoryKeyStore
from galahad_desktop.vault.vault import Vault, tokens_digest

Log = Callable[[str], None]
_PREFIX = struct.Struct(">8sHI")


def _store(vault: Vault, owner: str, generation: int, rng: random.Random) -> dict[str, Any]:
    # Same sizes for every block: swaps and rollbacks must be caught by the identity binding
    # (header digest, AAD), not merely by a file-size mismatch.
    tokens = [rng.randrange(262144) for _ in range(300)]
    payload = rng.randbytes(200_000)
    row = vault.write_block(
        kind="conversation",
        owner_id=owner,
        parent_id=None,
        tokens=tokens,
        generation=generation,
        fingerprint="f" * 64,
        payload=memoryview(payload),
        sealed_meta={"tokens_sha256": tokens_digest(tokens)},
        capture_ms=0.0,
        chunk_bytes=64 * 1024,
    )
    with vault.transaction():
        vault.records.insert("blocks", row)
    return dict(row)


def _records(data: bytes) -> list[tuple[int, int]]:
    """(offset, length) of each length-prefixed record after the header: sealed + chunks."""
    _m, _v, header_len = _PREFIX.unpack_from(data)
    offset = _PREFIX.size + header_len
    out = []
    while offset + 4 <= len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        out.append((offset, 4 + length))
        offset += 4 + length
    return out


def tamper_fuzz(mutations: int, seed: int, log: Log) -> dict[str, Any]:
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="galahad-tamper-"))
    vault = Vault(tmp / "data", MemoryKeyStore())
    try:
        older_a = _store(vault, "c-aaaa", 1, rng)
        head_a = _store(vault, "c-aaaa", 2, rng)
        other_b = _store(vault, "c-bbbb", 1, rng)
        path_of = {r["id"]: vault.blocks_dir / r["file_name"] for r in (older_a, head_a, other_b)}
        outcome: Counter[str] = Counter()
        by_kind: Counter[str] = Counter()
        examples: dict[str, str] = {}
        adjusted = {"count": 0}
        reasons: Counter[str] = Counter()

        def file_mutation(kind: str, target: dict[str, Any]) -> None:
            path = path_of[target["id"]]
            data = bytearray(path.read_bytes())
            if kind == "bit_flip":
                for _ in range(rng.randint(1, 8)):
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            elif kind == "truncate":
                del data[rng.randrange(len(data)) :]
            elif kind == "extend":
                data += rng.randbytes(rng.randint(1, 10_000))
            elif kind == "header_field":
                _header, raw = blockfile.read_header(path)
                fields = json.loads(raw)
                key = rng.choice(
                    [
                        "generation",
                        "owner_id",
                        "n_tokens",
                        "pos_end",
                        "kind",
                        "payload_bytes",
                        "fingerprint",
                        "chunk_bytes",
                        "nonce_prefix",
                        "parent_id",
                        "created_at",
                        "block_id",
                    ]
                )
                value = fields[key]
                fields[key] = (
                    value + rng.randint(1, 5)
                    if isinstance(value, int | float)
                    else "c-bbbb"
                    if key == "owner_id"
                    else "00" * 8
                    if key == "nonce_prefix"
                    else f"{value}x"
                )
                new_raw = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
                rest = data[_PREFIX.size + len(raw) :]
                data = bytearray(
                    _PREFIX.pack(blockfile.MAGIC, blockfile.FORMAT_VERSION, len(new_raw))
                    + new_raw
                    + rest
                )
            elif kind == "chunk_reorder":
                records = _records(bytes(data))
                if len(records) >= 3:
                    (a_off, a_len), (b_off, b_len) = rng.sample(records[1:], 2)
                    if a_off > b_off:
                        (a_off, a_len), (b_off, b_len) = (b_off, b_len), (a_off, a_len)
                    a, b = data[a_off : a_off + a_len], data[b_off : b_off + b_len]
                    data = (
                        data[:a_off] + b + data[a_off + a_len : b_off] + a + data[b_off + b_len :]
                    )
                else:
                    data[-1] ^= 1
            elif kind == "swap_other_owner":
                data = bytearray(path_of[other_b["id"]].read_bytes())
            elif kind == "rollback_older":
                data = bytearray(path_of[older_a["id"]].read_bytes())
            elif kind == "magic_or_version":
                position = rng.randrange(10)
                data[position] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
            if rng.random() < 0.5:
                # A stronger attacker also edits the catalog's plain columns to match the
                # file, so only the authenticated identity checks remain to catch it.
                changes: dict[str, Any] = {"file_bytes": len(data)}
                try:
                    _h, raw_header = blockfile.read_header(path)
                    changes["header_sha256"] = blockfile.header_digest(raw_header)
                except blockfile.BlockFormatError:
                    pass
                with vault.transaction():
                    vault.catalog.update("blocks", target["id"], changes)
                adjusted["count"] += 1

        def catalog_mutation(kind: str, target: dict[str, Any]) -> None:
            if kind == "catalog_blob_flip":
                column = rng.choice(["wrapped_key", "tokens_enc"])
                blob = bytearray(target[column])
                blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
                changes: dict[str, Any] = {column: bytes(blob)}
            elif kind == "catalog_key_swap":
                changes = {"wrapped_key": other_b["wrapped_key"]}
            elif kind == "catalog_digest":
                changes = {"header_sha256": other_b["header_sha256"]}
            else:  # catalog_field
                column = rng.choice(
                    [
                        "owner_id",
                        "generation",
                        "n_tokens",
                        "file_bytes",
                        "fingerprint",
                        "payload_bytes",
                        "kind",
                        "parent_id",
                        "pos_start",
                        "pos_end",
                    ]
                )
                value = target[column]
                changes = {column: value + 1 if isinstance(value, int) else f"{value}x"}
            with vault.transaction():
                vault.catalog.update("blocks", target["id"], changes)

        kinds = [
            "bit_flip",
            "truncate",
            "extend",
            "header_field",
            "chunk_reorder",
            "swap_other_owner",
            "rollback_older",
            "magic_or_version",
            "catalog_blob_flip",
            "catalog_key_swap",
            "catalog_digest",
            "catalog_field",
            "wrong_owner",
        ]
        for index in range(mutations):
            kind = kinds[index % len(kinds)] if index < len(kinds) else rng.choice(kinds)
            if kind == "wrong_owner":
                target = other_b  # a head pointer moved to B's block: read as A's
            elif kind in ("swap_other_owner", "rollback_older"):
                target = head_a
            else:
                target = rng.choice([older_a, head_a])
            path = path_of[target["id"]]
            saved_file = path.read_bytes()
            saved_row = vault.catalog.get("blocks", target["id"])
            if kind.startswith("catalog_"):
                catalog_mutation(kind, target)
            elif kind != "wrong_owner":
                file_mutation(kind, target)
            by_kind[kind] += 1
            try:
                vault.read_block(target["id"], expected_owner="c-aaaa")
                outcome["grafted"] += 1
            except IntegrityError as exc:
                outcome["refused"] += 1
                examples.setdefault(kind, str(exc))
                reasons[_reason(str(exc))] += 1
            except GalahadError as exc:
                outcome["refused_other"] += 1
                examples.setdefault(kind, str(exc))
            except Exception as exc:  # the fuzzer's purpose: find these
                outcome["crashed"] += 1
                examples.setdefault(f"CRASH {kind}", f"{type(exc).__name__}: {exc}")
            path.write_bytes(saved_file)
            assert saved_row is not None
            with vault.transaction():
                vault.catalog.update(
                    "blocks", target["id"], {k: v for k, v in saved_row.items() if k != "id"}
                )
            if index % 250 == 249:
                log(f"tamper: {index + 1}/{mutations}")
        intact = all(vault.read_block(r["id"]).tokens for r in (older_a, head_a, other_b))
        return {
            "command": "eval tamper",
            "mutations": mutations,
            "seed": seed,
            "refused": outcome["refused"] + outcome["refused_other"],
            "grafted": outcome["grafted"],
            "crashed": outcome["crashed"],
            "by_kind": dict(by_kind),
            "refused_by": dict(reasons),
            "catalog_also_edited": adjusted["count"],
            "example_messages": examples,
            "originals_intact": intact,
        }
    finally:
        vault.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _reason(message: str) -> str:
    for marker, reason in (
        ("failed authentication", "AES-GCM authentication"),
        ("does not match the catalog (swapped", "header digest binding"),
        ("does not match the catalog", "header field binding"),
        ("belongs to", "owner binding"),
        ("truncated or extended", "size check"),
        ("truncated", "format (truncated)"),
        ("bad magic", "magic"),
        ("version", "format version"),
        ("wrong length", "chunk framing"),
        ("extra bytes", "format (extra bytes)"),
    ):
        if marker in message:
            return reason
    return "other format check"


# -- crash trials -----------------------------------------------------------------------------


def galahad_command(data_dir: Path, settings: dict[str, Any], *args: str) -> list[str]:
    """`galahad --data-dir DATA --set KEY=VALUE ... ARGS`, as a child process runs it."""
    sets = [word for key, value in settings.items() for word in ("--set", f"{key}={value}")]
    cli = [sys.executable, "-m", "galahad_desktop.cli"]
    return [*cli, "--data-dir", str(data_dir), *sets, *args]


def _galahad(data_dir: Path, *args: str) -> list[str]:
    return galahad_command(data_dir, {"n_ctx": 2048}, *args)


def _json(data_dir: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [*_galahad(data_dir, *args), "--json"], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"galahad {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def kill_after(command: list[str], delay_s: float) -> tuple[bool, int]:
    """Run a command and SIGKILL it after `delay_s` unless it ended: (killed, exit code)."""
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return False, child.wait(timeout=delay_s)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGKILL)
        return True, child.wait()


def crash_trials(trials: int, seed: int, log: Log) -> dict[str, Any]:
    """SIGKILL deposits, turn persists and key rotations at random moments; after each,
    check that the catalog opens, the audit is clean (after repairing orphans it reports),
    every committed conversation resumes with an exact proof, and nothing committed is lost."""
    if os.environ.get("GALAHAD_KEYRING_READY") != "1":
        raise RuntimeError(
            "Crash trials write master keys: run them in a throwaway keyring "
            "(scripts/with-keyring.sh, which `python -m galahad_dev eval crashes` uses)."
        )
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="galahad-crash-"))
    data = tmp / "data"
    doc = tmp / "doc.txt"
    doc.write_text(
        "\n".join(f"Line {i}: the ledger of the north depot, entry {i * 7}." for i in range(60))
    )
    rows: list[dict[str, Any]] = []
    try:
        base = _json(data, "deposit", str(doc))
        first = _json(data, "ask", base["document_id"], "First question?", "--max-tokens", "4")
        committed: dict[str, int] = {first["conversation_id"]: 2}
        durations: dict[str, float] = {}
        operations = ["deposit", "persist", "rotate"]
        for trial in range(trials):
            operation = operations[trial % 3]
            conversation = rng.choice(sorted(committed))
            args = {
                "deposit": ("deposit", str(doc)),
                "persist": (
                    "chat",
                    "--conversation",
                    conversation,
                    "--message",
                    f"Trial {trial}?",
                    "--max-tokens",
                    "6",
                ),
                "rotate": ("keys", "rotate"),
            }[operation]
            # Aim at the working part of the operation (after the model has loaded): kill
            # somewhere in 30-105% of how long it took when it ran to the end.
            expected = durations.get(operation, 3.0)
            delay = expected * rng.uniform(0.3, 1.05)
            started = time.monotonic()
            killed, code = kill_after(_galahad(data, *args), delay)
            if not killed and code == 0:
                durations[operation] = max(
                    durations.get(operation, 0.0), time.monotonic() - started
                )
            audit_before = subprocess.run(
                [*_galahad(data, "audit", "--repair"), "--json"],
                capture_output=True,
                text=True,
                timeout=600,
            )
            repaired = (
                json.loads(audit_before.stdout).get("repaired", [])
                if audit_before.stdout
                else ["<audit failed>"]
            )
            audit = _json(data, "audit")
            listed = _json(data, "list")
            present = {c["id"]: c["n_messages"] for c in listed["conversations"]}
            lost = [c for c, n in committed.items() if present.get(c, 0) < n]
            for conversation_id, n in present.items():
                committed[conversation_id] = max(committed.get(conversation_id, 0), n)
            proofs = [_json(data, "resume", c)["proof"] for c in sorted(present)]
            survived = not audit["problems"] and not lost and all(p == "exact" for p in proofs)
            rows.append(
                {
                    "trial": trial,
                    "operation": operation,
                    "delay_s": round(delay, 3),
                    "killed": killed,
                    "repaired": repaired,
                    "problems": audit["problems"],
                    "lost": lost,
                    "proofs": proofs,
                    "survived": survived,
                }
            )
            log(
                f"crash trial {trial + 1}/{trials}: {operation}, "
                f"{'killed' if killed else 'finished'} at {delay:.2f}s, "
                f"{'ok' if survived else 'FAILED'}"
            )
        return {
            "command": "eval crashes",
            "trials": trials,
            "seed": seed,
            "killed": sum(r["killed"] for r in rows),
            "survived": sum(r["survived"] for r in rows),
            "by_operation": dict(Counter(r["operation"] for r in rows)),
            "conversations": len(committed),
            "results": rows,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- hostile documents ------------------------------------------------------------------------


def minimal_pdf(text: str, pages: int = 1) -> bytes:
    """A small valid PDF with one line of text per page (for tests and the corpus)."""
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(pages))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode())
    font = 3 + 2 * pages
    for i in range(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text} {i}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents "
            f"{4 + 2 * i} 0 R /Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def hostile_corpus(directory: Path, seed: int = 0) -> list[Path]:
    """Generate the bad inputs of the hardening issue; every one must get a clear error or
    bounded work, never a crash or a hang."""
    import zipfile

    import docx

    rng = random.Random(seed)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}
    pdf = minimal_pdf("A perfectly fine page")
    files["truncated.pdf"] = pdf[: len(pdf) // 2]
    files["malformed.pdf"] = b"%PDF-1.7\n" + rng.randbytes(4000)
    files["nested.pdf"] = pdf.replace(
        b"/MediaBox [0 0 612 792]", b"/MediaBox " + b"[" * 50_000 + b"]" * 50_000
    )
    files["loop-xref.pdf"] = (
        b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 1 0 R >> endobj\n"
        b"trailer << /Root 1 0 R /Prev 0 >>\nstartxref\n9\n%%EOF"
    )
    files["pdf-named.txt"] = pdf
    files["text-named.pdf"] = b"Just some text, not a PDF at all.\n" * 20
    good_docx = d / "_good.docx"
    document = docx.Document()
    document.add_paragraph("A perfectly fine paragraph.")
    document.save(str(good_docx))
    raw_docx = good_docx.read_bytes()
    good_docx.unlink()
    files["truncated.docx"] = raw_docx[: len(raw_docx) // 2]
    bomb = d / "zip-bomb.docx"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", b"<Types/>")
        archive.writestr("word/document.xml", b"\0" * (512 * 1024 * 1024))
    bad_xml = d / "bad-xml.docx"
    with zipfile.ZipFile(bad_xml, "w") as archive:
        archive.writestr("[Content_Types].xml", b"<Types><unclosed>")
        archive.writestr("word/document.xml", b"<w:document><<<")
    files["png-named.docx"] = b"\x89PNG\r\n\x1a\n" + rng.randbytes(2000)
    files["random.bin.txt"] = rng.randbytes(5000)
    files["invalid-utf8.md"] = b"# Title\n\ncaf\xe9 cr\xe8me \xff\xfe\n"
    files["empty.txt"] = b""
    files["blank.txt"] = b" \n\t\n  "
    files["model.gguf"] = b"GGUF" + rng.randbytes(100)
    files["elf-named.py"] = b"\x7fELF" + rng.randbytes(200)
    for name, content in files.items():
        (d / name).write_bytes(content)
    huge = d / "one-gigabyte.txt"  # sparse: 1 GB on paper, nothing on disk
    with open(huge, "wb") as handle:
        handle.truncate(1024**3)
    long_line = d / "forty-megabytes-one-line.txt"
    with open(long_line, "wb") as handle:
        for _ in range(40):
            handle.write(b"x" * (1024 * 1024))
    device = d / "device-link.txt"
    if not device.exists():
        device.symlink_to("/dev/urandom")
    return sorted(p for p in d.iterdir())


def eval_hostile(log: Log, timeout_s: float = 30.0, memory_mb: int = 1024) -> dict[str, Any]:
    """Extract every hostile input through the bounded reader and, when it yields text, put
    it through a real deposit's limits (without the model)."""
    from galahad_desktop.errors import CancelledError, InputError
    from galahad_desktop.memory.documents.extraction import extract_text_bounded

    tmp = Path(tempfile.mkdtemp(prefix="galahad-hostile-"))
    rows: list[dict[str, Any]] = []
    try:
        for path in hostile_corpus(tmp / "corpus"):
            start = time.monotonic()
            try:
                text = extract_text_bounded(path, timeout_s=timeout_s, memory_mb=memory_mb)
                outcome, message = "read", f"{len(text):,} characters"
            except InputError as exc:
                outcome, message = "refused", str(exc)
            except CancelledError as exc:
                outcome, message = "cancelled", str(exc)
            except Exception as exc:  # what this evaluation exists to catch
                outcome, message = "crashed", f"{type(exc).__name__}: {exc}"
            elapsed = time.monotonic() - start
            rows.append(
                {
                    "file": path.name,
                    "outcome": outcome,
                    "seconds": round(elapsed, 3),
                    "message": message,
                }
            )
            log(f"hostile: {path.name}: {outcome} in {elapsed:.2f}s")
        # Cancellation: a slow, valid PDF is stopped within a fraction of a second.
        slow = tmp / "slow-many-pages.pdf"
        slow.write_bytes(minimal_pdf("Page text", pages=4000))
        cancel = threading.Event()
        timer = threading.Timer(0.3, cancel.set)
        timer.start()
        start = time.monotonic()
        try:
            extract_text_bounded(slow, timeout_s=timeout_s, job=Job(cancel=cancel))
            cancelled = False
        except CancelledError:
            cancelled = True
        cancel_s = time.monotonic() - start
        timer.cancel()
        return {
            "command": "eval hostile",
            "inputs": len(rows),
            "refused": sum(r["outcome"] == "refused" for r in rows),
            "read": sum(r["outcome"] == "read" for r in rows),
            "crashed": sum(r["outcome"] == "crashed" for r in rows),
            "slowest_s": max(r["seconds"] for r in rows),
            "cancel_honoured": cancelled,
            "cancel_s": round(cancel_s, 3),
            "limits": {"timeout_s": timeout_s, "memory_mb": memory_mb},
            "results": rows,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
