"""The verified-answer library from the terminal."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from galahad_desktop.cli.common import Output, add_sampling, sampling_of
from galahad_desktop.errors import InputError

if TYPE_CHECKING:  # imported when a command runs: --help stays quick
    from galahad_desktop.memory.galahad import Galahad


def cmd_verified(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    items = list(args.items)
    if args.action in ("add", "check"):
        if len(items) != 2:
            raise InputError(f"verified {args.action} needs QUESTION and ANSWER.")
        if args.action == "check":
            verdict = core.verified_check(items[0], items[1])
            if verdict is None:
                out.result({"checkable": False}, "No verifier can check this question.")
                return 0
            out.result(
                {"checkable": True, **verdict.__dict__},
                f"{'passes' if verdict.ok else 'FAILS'} its {verdict.verifier} check "
                f"(expected {verdict.expected})",
            )
            return 0 if verdict.ok else 1
        entry = core.verified_add(items[0], items[1], user_verified=args.user_verified)
        out.result(entry, f"Stored verified answer {entry.id} ({entry.verifier}).")
        return 0
    if args.action == "list":
        entries = core.verified_entries()
        out.result(
            {"entries": entries},
            "\n".join(f"{e.id}  uses {e.uses:>3}  {e.question} -> {e.answer}" for e in entries)
            or "The library is empty.",
        )
        return 0
    if args.action == "remove":
        if len(items) != 1:
            raise InputError("verified remove needs the entry's id.")
        core.verified_remove(items[0])
        out.result({"removed": items[0]}, f"Removed {items[0]}.")
        return 0
    if len(items) != 1:
        raise InputError("verified ask needs one QUESTION.")
    conversation = args.conversation or core.new_conversation()
    result = core.send(conversation, items[0], params=sampling_of(core, args))
    label = (result.library.label if result.library else "") or "answered by the model"
    out.result(
        result,
        f"{result.reply}\n({label}; {result.counters.generated_tokens} decode tokens)",
    )
    return 0


def register(add: Any) -> None:
    p = add("verified", "the verified-answer library", cmd_verified)
    p.add_argument("action", choices=["add", "list", "remove", "ask", "check"])
    p.add_argument(
        "items",
        nargs="*",
        help="add/check: QUESTION ANSWER; remove: ID; ask: QUESTION (or --conversation ID "
        "QUESTION)",
    )
    p.add_argument("--conversation")
    p.add_argument(
        "--user-verified",
        action="store_true",
        help="store an answer no verifier can check, on your word",
    )
    add_sampling(p)
