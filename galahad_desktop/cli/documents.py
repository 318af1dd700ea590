"""Documents from the terminal: deposit, ask (routed), add-document, routing-log."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from galahad_desktop.cli.chat import run_turn
from galahad_desktop.cli.common import (
    Output,
    add_sampling,
    command_job,
    sampling_of,
)
from galahad_desktop.errors import InputError

if TYPE_CHECKING:  # imported when a command runs: --help stays quick
    from galahad_desktop.memory.galahad import Galahad

GATED_EXIT = 9  # the router was not sure: candidates listed, nothing answered


def cmd_deposit(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    with command_job(out, "reading") as job:
        result = core.deposit(args.file, job, anyway=args.anyway)
    out.result(
        result,
        f"Stored document {result.document_id} '{result.name}': "
        f"{result.tokens:,} tokens read in {result.prefill_ms / 1e3:.1f} s, "
        + (f"{result.n_parts} parts, blocks " if result.n_parts > 1 else "block ")
        + f"{result.block_bytes / 1e6:.1f} MB"
        + (
            f" ({result.pictures} picture{'s' if result.pictures > 1 else ''}: "
            f"{result.image_tokens:,} image tokens, encoded in {result.encode_ms / 1e3:.2f} s)"
            if result.pictures
            else ""
        )
        + (
            f" (a {result.audio_seconds:.0f}-second voice memo heard in {result.sounds} "
            f"part{'s' if result.sounds > 1 else ''}: {result.audio_tokens:,} audio tokens, "
            f"encoded in {result.encode_ms / 1e3:.2f} s)"
            if result.sounds
            else ""
        ),
    )
    return 0


def cmd_ask(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    if args.question is None:
        document_id, question = None, args.target
    else:
        document_id, question = args.target, args.question
    if (
        document_id is not None
        and args.part is None
        and core.document_parts_count(document_id) == 1
    ):
        # One part: no routing to do; a conversation on the document.
        conversation_id = core.new_conversation(document_id=document_id)
        result = run_turn(core, out, conversation_id, question, args)
        if out.as_json:
            out.result(result, "")
        return 0
    with command_job(out, "re-reading", answer=True) as job:
        answer = core.ask(question, document_id, args.part, job, sampling_of(core, args))
    if not answer.answered:
        d = answer.decision
        lines = [f"{answer.why} Candidates (answer with --part ID):"]
        for c, cited in zip(d.candidates, answer.candidates_cited, strict=True):
            scores = (
                f"share {c.coverage:.2f}  BM25 {c.score:.2f}"
                if c.similarity is None
                else f"meaning {c.similarity:.0%}  words {c.coverage:.0%}"
            )
            pmi = d.pmi_of(c.part_id)
            if pmi is not None:
                scores += f"  model {pmi:+.1f} nats"
            lines.append(f"  {c.part_id}  {cited}  {scores}")
        if not d.candidates:
            lines.append("  (none)")
        out.result(answer, "\n".join(lines))
        return GATED_EXIT
    if not out.as_json:
        print()
    graft = answer.graft
    verdict: str = graft.proof.verdict if graft else "already loaded"
    restored = graft.restored_tokens if graft else 0
    recomputed = graft.recomputed_tokens if graft else 0
    if answer.across and answer.counters is not None:  # the later parts stacked
        verdict = f"first part {verdict}, the others stacked: close, not byte-exact"
        restored += answer.counters.stacked_tokens
        recomputed = answer.counters.recomputed_tokens
    out.result(
        answer,
        f"[{answer.citation} · restored {restored:,} tokens, recomputed {recomputed:,} · "
        f"{verdict}] {answer.why}",
    )
    return 0


def cmd_add_document(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    # A path that exists is a file (stacked when the library already holds it); anything
    # else must be a stored document's id. Checked before anything is read.
    stored_ids = {d.id for d in core.list_documents()}
    batches: list[tuple[str, list[str]]] = []  # ("file", [path]) or ("stored", [ids...])
    for source in args.sources:
        if Path(source).exists():
            batches.append(("file", [source]))
        elif source in stored_ids:
            if batches and batches[-1][0] == "stored":
                batches[-1][1].append(source)
            else:
                batches.append(("stored", [source]))
        else:
            raise InputError(
                f"'{source}' is neither a file nor a stored document's id (see `documents`). "
                "Nothing was added."
            )
    lines: list[str] = []
    turns: list[dict[str, Any]] = []
    with command_job(out, "adding") as job:
        for kind, items in batches:
            if kind == "file":
                turn = core.add_document_file(args.conversation_id, Path(items[0]), job)
            else:
                turn = core.add_stored_documents(
                    args.conversation_id, items, job, verify=args.verify
                )
            c = turn.counters
            turns.append(turn.as_dict())
            if turn.stack is not None:
                lines.append(f"{turn.stack.describe()}; read 0 new document tokens.")
            else:
                lines.append(
                    f"Added '{Path(items[0]).name}': read {c.new_tokens:,} new tokens, "
                    f"restored {c.restored_tokens:,}, recomputed {c.recomputed_tokens:,}."
                )
    out.result(
        {**turns[-1], "turns": turns, "links": core.chain_links(args.conversation_id)},
        f"To {args.conversation_id}:\n" + "\n".join(lines),
    )
    return 0


def cmd_routing_log(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    entries = core.routing_log(args.limit)
    out.result(
        {"entries": entries},
        "\n".join(
            f"{e.decision:>8}  best {e.best_score:.2f}  margin {e.margin:.2f}  {e.scope}  -> "
            f"{e.part_id}"
            + (
                f"  (model checked {len(e.rerank)} parts in {e.rerank_ms or 0:.0f} ms)"
                if e.rerank is not None
                else ""
            )
            for e in entries
        )
        or "No routing decisions yet.",
    )
    return 0


def register(add: Any) -> None:
    p = add("deposit", "read a document once and store its KV block", cmd_deposit)
    p.add_argument("file", type=Path)
    p.add_argument(
        "--anyway",
        action="store_true",
        help="read it even when its memory would not fit the disk budget or the disk",
    )
    p = add(
        "ask",
        "answer from a stored document without re-reading it; a long document (or, with "
        "only a question, the whole library) goes through the router, which answers from the "
        f"best part or, when unsure, lists the candidates and exits {GATED_EXIT}",
        cmd_ask,
    )
    p.add_argument("target", help="a document id, or the question (ask the whole library)")
    p.add_argument("question", nargs="?")
    p.add_argument("--part", help="answer from this part (one of the router's candidates)")
    add_sampling(p)
    p = add(
        "add-document",
        "put documents into a conversation: a new file is read once; stored ones (by id, "
        "or a file the library holds) are stacked without reading them again",
        cmd_add_document,
    )
    p.add_argument("conversation_id")
    p.add_argument(
        "sources",
        nargs="+",
        metavar="FILE_OR_ID",
        help="document files, or stored documents' ids: stored ones are stacked after what "
        "the conversation holds (their first tokens recomputed), never read again",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="measure stacked documents against a full read of the same tokens (KL, argmax)",
    )
    p = add(
        "routing-log",
        "the router's recent decisions: scores and margins, no questions",
        cmd_routing_log,
    )
    p.add_argument("--limit", type=int, default=20)
