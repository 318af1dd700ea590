"""The store from the terminal: verify, audit, forget, keys, backup and restore."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from galahad_desktop.cli.common import Output, data_dir_of, open_core, passphrase_for
from galahad_desktop.errors import InputError, KeyAccessError

if TYPE_CHECKING:  # imported when a command runs: --help stays quick
    from galahad_desktop.memory.galahad import Galahad


def cmd_verify(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    if not args.all and not args.id:
        raise InputError("Give an id to verify, or --all.")
    results = core.verify(None if args.all else args.id)
    ok = all(r.proof in ("exact", "close") for r in results)
    out.result(
        {"results": results, "ok": ok, "fingerprint": core.info().fingerprint},
        "\n".join(
            f"{r.block_id} ({r.kind} {r.owner_id}, {r.tokens:,} tokens): {r.proof}" for r in results
        )
        or "No blocks.",
    )
    return 0 if ok else 1


def cmd_audit(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    report = core.audit(repair=args.repair)
    text = (
        f"{report.ok}/{report.blocks} blocks ok"
        + (f" ({report.given_back} given back to the disk budget)" if report.given_back else "")
        + "".join(f"\nproblem: {p}" for p in report.problems)
        + "".join(f"\nrepaired: {r}" for r in report.repaired)
    )
    out.result(report.as_dict(), text)
    return 0 if not report.problems else 1


def cmd_forget(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    result = core.forget(args.id)
    out.result(result, f"Forgot {result.kind} {args.id} ({result.blocks} blocks deleted).")
    return 0


def cmd_storage(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    from galahad_desktop.sizes import human_size

    notes: list[str] = []
    both = set(args.keep or []) & (set(args.give_back or []) | set(args.unkeep or []))
    if both:
        raise InputError(
            f"{', '.join(sorted(both))}: --keep with --give-back or --unkeep for the same item "
            "says two things; nothing was changed."
        )
    for item_id in args.keep or []:
        notes.append(f"Kept {core.keep(item_id, True).title!r}: never given back.")
    for item_id in args.unkeep or []:
        notes.append(f"{core.keep(item_id, False).title!r} may be given back again.")
    for item_id in args.give_back or []:
        done = core.give_back(item_id)
        notes.append(
            f"Gave back {human_size(done.bytes_freed)} of {done.kind} {done.title!r} "
            f"({done.blocks} blocks); its messages stay, and it is re-read when next opened."
        )
    report = core.storage()
    limit = human_size(report.budget_bytes) if report.budget_bytes else "no limit"
    lines = [
        *notes,
        f"{human_size(report.total_bytes)} on disk in {report.data_dir} (blocks "
        f"{human_size(report.blocks_bytes)}); budget {limit}: {report.budget_rule}.",
        f"The disk: {human_size(report.disk_bytes)}, {human_size(report.disk_free_bytes)} free.",
    ]
    if report.over_budget:
        lines.append("Over the budget: what must stay stored (open or kept) is larger than it.")
    for item in report.items:
        flags = "".join(f" · {f}" for f, on in (("kept", item.kept), ("open", item.open)) if on)
        lines.append(
            f"{item.id}  {item.kind:<12} {human_size(item.bytes):>9}  {item.state}{flags}  "
            f"{item.title}"
        )
    out.result({**asdict(report), "over_budget": report.over_budget}, "\n".join(lines))
    return 0


def recovery_passphrase(confirm: bool) -> str:
    """The recovery kit's passphrase: $GALAHAD_RECOVERY_PASSPHRASE, else asked for."""
    env = os.environ.get("GALAHAD_RECOVERY_PASSPHRASE")
    if env:
        return env
    if not sys.stdin.isatty():
        raise KeyAccessError(
            "A recovery passphrase is needed: set GALAHAD_RECOVERY_PASSPHRASE or run interactively."
        )
    import getpass

    first = getpass.getpass("Recovery passphrase: ")
    if confirm and getpass.getpass("Again: ") != first:
        raise InputError("The two recovery passphrases differ; nothing was written.")
    return first


def cmd_keys(args: argparse.Namespace, out: Output) -> int:
    from galahad_desktop.memory.galahad import Galahad

    if args.action == "import":
        if not args.file:
            raise InputError("Give the recovery kit to import: galahad keys import KIT.")
        data_dir = data_dir_of(args)
        imported = Galahad.import_recovery_kit(
            data_dir,
            args.file,
            lambda: recovery_passphrase(False),  # asked once the kit was read and checked
            passphrase_for(args, data_dir),
        )
        out.result(
            {"imported": imported},
            f"Imported {len(imported)} key(s) into this machine's keystore: " + ", ".join(imported),
        )
        return 0
    core = open_core(args)
    try:
        return keys_with_core(core, out, args)
    finally:
        core.close()


def keys_with_core(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    if args.action == "rotate":
        rotated = core.rotate_key()
        text = (
            f"Rotated the master key; re-wrapped {rotated.blocks_rewrapped} block keys. "
            f"The old key {rotated.retired_key_id} is kept until you run "
            "'galahad keys drop-retired'"
        )
        if rotated.backups_needing_retired:
            text += f"; {len(rotated.backups_needing_retired)} backup(s) need it: " + "; ".join(
                rotated.backups_needing_retired
            )
        out.result(rotated, text + ".")
        return 0
    if args.action == "export":
        if not args.out:
            raise InputError("Give a file for the recovery kit: galahad keys export --out FILE.")
        keys = core.export_recovery_kit(recovery_passphrase(True), args.out)
        out.result(
            {"kit": str(args.out), "keys": keys},
            f"Wrote the recovery kit {args.out} ({len(keys)} key(s): {', '.join(keys)}). "
            "Keep it and its passphrase apart from your backups.",
        )
        return 0
    if args.action == "drop-retired":
        dropped, stranded = core.drop_retired_keys(args.yes)
        out.result(
            {"dropped": dropped, "backups_stranded": stranded},
            f"Dropped {len(dropped)} retired key(s)"
            + (f"; {len(stranded)} backup(s) now need a recovery kit" if stranded else "")
            + ".",
        )
        return 0
    status = core.key_status()
    retired = (
        f"; retired, kept: {', '.join(status.retired_key_ids)}" if status.retired_key_ids else ""
    )
    out.result(status, f"Master key {status.key_id} in {status.backend}{retired}")
    return 0


def cmd_backup(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    result = core.backup(args.dest)
    out.result(
        result,
        f"Backed up {result.files} files ({result.bytes / 1e6:,.1f} MB, still encrypted) to "
        f"{result.path}. It opens with key {result.key_id}: this machine's keystore, or a "
        "recovery kit (galahad keys export). Restore it with: galahad restore "
        f"{result.path}",
    )
    return 0


def cmd_restore(args: argparse.Namespace, out: Output) -> int:
    from galahad_desktop.memory.galahad import Galahad
    from galahad_desktop.vault.keys import keystore_mode_file

    data_dir = data_dir_of(args)
    passphrase = (
        passphrase_for(args, args.backup) if keystore_mode_file(args.backup).exists() else None
    )
    result, report = Galahad.restore(args.backup, data_dir, passphrase)
    text = f"Restored {result.restored_from} as {result.data_dir}"
    if result.previous_kept_at:
        text += f"; what was there is kept at {result.previous_kept_at}"
    text += f". {report.ok}/{report.blocks} blocks ok" + "".join(
        f"\nproblem: {p}" for p in report.problems
    )
    out.result({"restore": result, "audit": report.as_dict()}, text)
    return 0 if not report.problems else 1


def register(add: Any) -> None:
    p = add("verify", "re-run the graft proof of a conversation, document or block", cmd_verify)
    p.add_argument("id", nargs="?")
    p.add_argument("--all", action="store_true")
    p = add("audit", "check every block file and catalog record", cmd_audit)
    p.add_argument("--repair", action="store_true", help="remove orphan and unfinished files")
    p = add(
        "storage",
        "what kept memory takes on disk against the disk budget; keep or give back an item",
        cmd_storage,
    )
    p.add_argument("--keep", action="append", metavar="ID", help="never give back its blocks")
    p.add_argument("--unkeep", action="append", metavar="ID", help="undo --keep")
    p.add_argument(
        "--give-back", action="append", metavar="ID", help="delete its blocks now (re-read later)"
    )
    p = add("forget", "delete a conversation or document with its blocks and keys", cmd_forget)
    p.add_argument("id")
    p = add(
        "keys",
        "master keys: status, rotate, export/import a recovery kit, drop retired keys",
        cmd_keys,
        core=False,
    )
    p.add_argument("action", choices=["status", "rotate", "export", "import", "drop-retired"])
    p.add_argument("file", nargs="?", type=Path, help="import: the recovery kit")
    p.add_argument("--out", type=Path, help="export: the recovery kit file to write")
    p.add_argument(
        "--yes", action="store_true", help="drop-retired: even if backups still need them"
    )
    p = add("backup", "a consistent, still-encrypted copy of the data directory", cmd_backup)
    p.add_argument("dest", type=Path, help="a new (or empty) folder")
    p = add(
        "restore",
        "make a backup (or an older copy) the data directory; what is there is kept aside",
        cmd_restore,
        core=False,
    )
    p.add_argument("backup", type=Path)
