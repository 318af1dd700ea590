"""`galahad --self-test`: a small document stored, resumed in a fresh engine and proven exact.

The benchmarks are development tools (`python -m galahad_dev bench`), not part of the app."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from galahad_desktop.cli.common import Output, parse_pairs

GENERATED = "generated"


def self_test(args: argparse.Namespace, out: Output) -> int:
    """Deposit a small document, resume it in a fresh engine, require an exact proof; a
    chain link, the router and the model's turn format too."""
    from galahad_desktop.memory.galahad import Galahad
    from galahad_desktop.vault.keys import MemoryKeyStore

    keystore = MemoryKeyStore()  # a throwaway key: the self-test must not touch the keyring
    overrides: dict[str, Any] = {"temperature": 0.0, **parse_pairs(args.set)}
    with tempfile.TemporaryDirectory(prefix="galahad-self-test-") as tmp:
        doc = Path(tmp) / "self-test.txt"
        doc.write_text("Galahad self-test. The access code of the vault is 4711.\n" * 20)
        data = Path(tmp) / "data"
        first = Galahad(data, model_path=args.model, keystore=keystore, overrides=overrides)
        try:
            deposited = first.deposit(doc)
            info = first.info()
            backend, placement = info.backend, info.placement
            system_info = info.fingerprint_details.system_info
        finally:
            first.close()
        second = Galahad(data, model_path=args.model, keystore=keystore, overrides=overrides)
        try:
            conversation = second.new_conversation(document_id=deposited.document_id)
            report = second.resume(conversation)
            # A turn stored as a chain link on the document's block, spliced back exactly.
            second.send(conversation, "Thank you.", params=second.sampling(max_tokens=4))
            second.reload_engine()
            chained = second.resume(conversation)
            links = second.chain_links(conversation) + 1
            # The router (SQLite FTS5, in memory) over the stored part.
            routed = second.ask(
                "What is the access code of the vault?", params=second.sampling(max_tokens=4)
            )
            info = second.info()
        finally:
            second.close()
        pictures = _picture_reader_works(Path(tmp))
    mcp_sdk = Galahad.tools_sdk()  # the window's MCP tools: the SDK loads in this build
    ok = (
        report.proof.verdict == "exact"
        and report.recomputed_tokens == 0
        and chained.proof.verdict == "exact"
        and chained.recomputed_tokens == 0
        and links == 2
        and routed.answered
        and pictures
        and bool(mcp_sdk)
    )
    out.result(
        {
            "ok": ok,
            "tokens": deposited.tokens,
            "restored_tokens": report.restored_tokens,
            "recomputed_tokens": report.recomputed_tokens,
            "proof": report.proof.verdict,
            "restore_ms": report.restore_ms,
            "prefill_ms": deposited.prefill_ms,
            "chain_links": links,
            "chain_proof": chained.proof.verdict,
            "routed": routed.answered,
            "picture_reader": pictures,
            "mcp_sdk": mcp_sdk,
            "backend": backend,
            "system_info": system_info,
            "device": placement.device if placement else "CPU",
            "cpu_variant": placement.cpu_variant if placement else "",
            "model": info.model.name,
            "turn_format": info.turn_format_note,
        },
        f"self-test {'passed' if ok else 'FAILED'}: {deposited.tokens} tokens, "
        f"{report.describe()} ({info.device_note()})",
    )
    return 0 if ok else 1


def _picture_reader_works(folder: Path) -> bool:
    """The limited child reads a picture and a scanned page (Pillow and PDFium in this
    build, a frozen one included); the embedded model reads no pictures, so only the
    reader is checked here."""
    from PIL import Image

    from galahad_desktop.memory.documents.pictures import read_pictures_bounded

    picture, scan = folder / "self-test.png", folder / "self-test.pdf"
    Image.new("RGB", (320, 200), (30, 90, 200)).save(picture)
    Image.new("RGB", (400, 560), "white").save(scan)
    [read] = read_pictures_bounded(picture)
    pages = read_pictures_bounded(scan, "scan")
    return (
        (read.width, read.height) == (320, 200)
        and read.rgb[:3] == bytes((30, 90, 200))
        and (len(pages) == 1)
    )
