"""The store from the terminal: verify, audit, forget, keys."""

from __future__ import annotations

import argparse
from typing import Any

from galahad_desktop.cli.common import Output
from galahad_desktop.errors import InputError


def cmd_verify(core: Any, out: Output, args: argparse.Namespace) -> int:
    if not args.all and not args.id:
        raise InputError("Give an id to verify, or --all.")
    results = core.verify(None if args.all else args.id)
    ok = all(r.proof in ("exact", "close") for r in results)
    out.result(
        {"results": results, "ok": ok, "fingerprint": core.engine.fingerprint},
        "\n".join(
            f"{r.block_id} ({r.kind} {r.owner_id}, {r.tokens:,} tokens): {r.proof}" for r in results
        )
        or "No blocks.",
    )
    return 0 if ok else 1


def cmd_audit(core: Any, out: Output, args: argparse.Namespace) -> int:
    report = core.audit(repair=args.repair)
    text = (
        f"{report.ok}/{report.blocks} blocks ok"
        + "".join(f"\nproblem: {p}" for p in report.problems)
        + "".join(f"\nrepaired: {r}" for r in report.repaired)
    )
    out.result(report.as_dict(), text)
    return 0 if not report.problems else 1


def cmd_forget(core: Any, out: Output, args: argparse.Namespace) -> int:
    result = core.forget(args.id)
    out.result(result, f"Forgot {result.kind} {args.id} ({result.blocks} blocks deleted).")
    return 0


def cmd_keys(core: Any, out: Output, args: argparse.Namespace) -> int:
    if args.action == "rotate":
        rotated = core.rotate_key()
        out.result(
            {
                "rotated": True,
                "key_id": rotated.key_id,
                "blocks_rewrapped": rotated.blocks_rewrapped,
            },
            f"Rotated the master key; re-wrapped {rotated.blocks_rewrapped} block keys.",
        )
        return 0
    status = core.key_status()
    out.result(status, f"Master key {status.key_id} in {status.backend}")
    return 0


def register(add: Any) -> None:
    p = add("verify", "re-run the graft proof of a conversation, document or block", cmd_verify)
    p.add_argument("id", nargs="?")
    p.add_argument("--all", action="store_true")
    p = add("audit", "check every block file and catalog record", cmd_audit)
    p.add_argument("--repair", action="store_true", help="remove orphan and unfinished files")
    p = add("forget", "delete a conversation or document with its blocks and keys", cmd_forget)
    p.add_argument("id")
    p = add("keys", "master key: where it lives, rotate it", cmd_keys)
    p.add_argument("action", choices=["status", "rotate"])
