"""Measurements any user can run: `galahad bench resume|deposit` and `galahad --self-test`."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from galahad_desktop.cli.common import Output, parse_pairs
from galahad_desktop.errors import InputError
from galahad_desktop.system.files import atomic_write_bytes, read_regular_file

GENERATED = "generated"


def cmd_bench(args: argparse.Namespace, out: Output) -> int:
    from galahad_desktop import bench

    overrides = parse_pairs(args.set)
    sizes = bench.parse_sizes(args.sizes)
    kv_types = tuple(k.strip() for k in args.kv_types.split(",") if k.strip())
    if any(k not in ("f16", "q8_0") for k in kv_types) or not kv_types:
        raise InputError("--kv-types takes f16, q8_0 or both (comma-separated).")
    if args.image is not None and args.kind != "resume":
        raise InputError("--image goes with `galahad bench resume`.")
    if args.kind == "resume" and args.image is not None:
        picture = None if args.image == GENERATED else Path(args.image)
        result = bench.bench_picture(args.reps, args.model, overrides, out.info, picture)
        text = bench.picture_table(result)
    elif args.kind == "resume":
        result = bench.bench_resume(sizes, args.reps, args.model, overrides, out.info, kv_types)
        text = bench.resume_table(result)
    elif args.kind == "deposit":
        result = bench.bench_deposit(sizes, args.reps, args.model, overrides, out.info, kv_types)
        text = bench.deposit_table(result)
    else:
        source = None
        if args.text is not None:
            source = read_regular_file(args.text, 64 * 2**20, "a text").decode("utf-8", "replace")
        result = bench.bench_kv_quality(
            sizes[0], args.window, args.model, overrides, out.info, source
        )
        text = bench.quality_table(result)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        # One file per benchmark, replaced by each run (git keeps the history).
        name = f"{args.kind}-image" if args.image is not None else args.kind
        path = args.out / f"bench-{name}.json"
        result["saved_to"] = str(path)
        result["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
        atomic_write_bytes(path, json.dumps(result, indent=1, default=str).encode())
    out.result(result, text)
    return 0


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
            system_info = info.fingerprint_details["system_info"]
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
    ok = (
        report.proof.verdict == "exact"
        and report.recomputed_tokens == 0
        and chained.proof.verdict == "exact"
        and chained.recomputed_tokens == 0
        and links == 2
        and routed.answered
        and pictures
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


def register(add: Any) -> None:
    p = add(
        "bench",
        "measure restore and deposit against plain llama.cpp on this machine (throwaway data dir)",
        cmd_bench,
        core=False,
    )
    p.add_argument("kind", choices=["resume", "deposit", "kv-quality"])
    p.add_argument(
        "--sizes",
        default="1000,4000,16000",
        help="token counts, comma-separated (kv-quality: the first is the tokens read)",
    )
    p.add_argument(
        "--kv-types", default="f16,q8_0", help="resume, deposit: KV cache types, side by side"
    )
    p.add_argument("--window", type=int, default=256, help="kv-quality: tokens predicted")
    p.add_argument("--text", type=Path, help="kv-quality: a held-out text (default: generated)")
    p.add_argument(
        "--image",
        nargs="?",
        const=GENERATED,
        metavar="PICTURE",
        help="resume: one picture (default: a generated photo) restored from its block against "
        "the vision encoder and prefill again (needs a model with a vision projector)",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions (medians are reported)")
    p.add_argument("--out", type=Path, help="also save the JSON here (a directory)")
