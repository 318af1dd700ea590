"""The `galahad` command: the same core as the app, scriptable.

Every command takes --data-dir, --model and --json (exactly one JSON object on stdout).
Errors print one clear message on stderr and exit non-zero; with --json an {"error": ...}
object is printed on stdout as well.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from galahad_desktop import __version__
from galahad_desktop.engine.engine import Progress
from galahad_desktop.errors import GalahadError, InputError, KeyAccessError
from galahad_desktop.paths import default_data_dir


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--data-dir",
        type=Path,
        default=default(None),
        help="data directory (default: $GALAHAD_DATA_DIR or the user data dir)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=default(None),
        help="GGUF model file (default: the embedded Gemma 3 270M)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print exactly one JSON object on stdout",
    )
    parser.add_argument(
        "--passphrase",
        action="store_true",
        default=default(False),
        help="protect the data directory with a passphrase instead of the OS keyring "
        "(asked for, or read from $GALAHAD_PASSPHRASE)",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        default=default([]),
        help="override a setting for this run (e.g. --set n_ctx=4096)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="galahad",
        description="Private local chat with encrypted, provable KV-cache grafts.",
    )
    parser.add_argument("--version", action="version", version=f"galahad {__version__}")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="deposit, resume and prove a small document in a temp data dir",
    )
    _common(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p, suppress=True)
        return p

    p = add("deposit", "read a document once and store its KV block")
    p.add_argument("file", type=Path)
    p = add(
        "ask",
        "answer from a stored document without re-reading it; a long document (or, with "
        "only a question, the whole library) goes through the router, which answers from the "
        f"best part or, when unsure, lists the candidates and exits {GATED_EXIT}",
    )
    p.add_argument("target", help="a document id, or the question (ask the whole library)")
    p.add_argument("question", nargs="?")
    p.add_argument("--part", help="answer from this part (one of the router's candidates)")
    _sampling_args(p)
    p = add("add-document", "put a document into a conversation (prefills only the new one)")
    p.add_argument("conversation_id")
    p.add_argument("file", type=Path)
    p = add("compact", "merge a conversation's older chain links into one block")
    p.add_argument("conversation_id")
    p.add_argument("--keep", type=int, help="newest turn links kept separate (default: setting)")
    p = add("routing-log", "the router's recent decisions: scores and margins, no questions")
    p.add_argument("--limit", type=int, default=20)
    p = add("chat", "streaming chat in the terminal, or one turn with --message")
    p.add_argument("--conversation", help="continue this conversation")
    p.add_argument("--document", help="start a conversation on this document")
    p.add_argument("--message", help="send one message and exit")
    _sampling_args(p)
    p = add("resume", "graft a stored conversation and report what it cost")
    p.add_argument("conversation_id")
    add("list", "list conversations and documents")
    p = add("show", "print a conversation's messages")
    p.add_argument("conversation_id")
    p = add("verify", "re-run the graft proof of a conversation, document or block")
    p.add_argument("id", nargs="?")
    p.add_argument("--all", action="store_true")
    p = add("audit", "check every block file against the catalog")
    p.add_argument("--repair", action="store_true", help="remove orphan and unfinished files")
    p = add("forget", "delete a conversation or document with its blocks and keys")
    p.add_argument("id")
    p = add("keys", "master key: where it lives, rotate it")
    p.add_argument("action", choices=["status", "rotate"])
    p = add("settings", "show settings, or change them with KEY=VALUE")
    p.add_argument("changes", nargs="*", metavar="KEY=VALUE")
    add("info", "model, runtime fingerprint and backend")
    p = add("models", "download a Gemma GGUF from the Hugging Face Hub (resumable, verified)")
    p.add_argument("action", choices=["download"])
    p.add_argument("repo_id")
    p.add_argument("filename")
    p.add_argument("--revision")
    p.add_argument("--use", action="store_true", help="make it the model in settings")
    p = add("gui", "open the desktop window")
    p = add("verified", "the verified-answer library")
    p.add_argument("action", choices=["add", "list", "remove", "ask", "check"])
    p.add_argument(
        "items",
        nargs="*",
        help="add/check: QUESTION ANSWER; remove: ID; "
        "ask: QUESTION (or --conversation ID QUESTION)",
    )
    p.add_argument("--conversation")
    p.add_argument(
        "--user-verified",
        action="store_true",
        help="store an answer no verifier can check, on your word",
    )
    _sampling_args(p)
    p = add("bench", "benchmarks side by side with the alternatives (throwaway data dir)")
    p.add_argument("kind", choices=["resume", "persist", "deposit"])
    p.add_argument("--sizes", default="1000,4000,16000", help="token counts, comma-separated")
    p.add_argument("--reps", type=int, default=3, help="repetitions (medians are reported)")
    p.add_argument("--turns", type=int, default=3, help="turns per size (persist)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p = add("eval", "evaluations (throwaway data dir)")
    p.add_argument(
        "kind", choices=["needles", "memory", "tamper", "crashes", "hostile", "flywheel"]
    )
    p.add_argument("--tokens", type=int, default=200_000, help="memory: tokens to deposit")
    p.add_argument("--probes", type=int, default=50, help="memory: routed questions")
    p.add_argument("--doc-tokens", type=int, default=12_000, help="memory: tokens per document")
    p.add_argument("--problems", type=int, default=30, help="flywheel: problems")
    p.add_argument("--attempts", type=int, default=5, help="flywheel: best-of-N first solve")
    p.add_argument(
        "--oracle",
        action="store_true",
        help="flywheel: store the verifier's answer when the model fails (tool solve)",
    )
    p.add_argument("--mutations", type=int, default=1000, help="tamper: mutations to try")
    p.add_argument("--trials", type=int, default=30, help="crashes: kill trials")
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--block-tokens", type=int, default=2000)
    p.add_argument("--controls", type=int, default=None, help="16 (needles), 20 (memory)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    return parser


GATED_EXIT = 9  # the router was not sure: candidates listed, nothing answered


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--seed", type=int)


def _parse_pairs(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"'{pair}' is not KEY=VALUE.")
        out[key.strip()] = value.strip()
    return out


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def info(self, text: str) -> None:
        """Human progress and status: stderr, so stdout stays clean for --json."""
        print(text, file=sys.stderr, flush=True)

    def result(self, obj: dict[str, Any], text: str) -> None:
        if self.as_json:
            print(json.dumps(obj, default=str))
        else:
            print(text)


def _progress(out: Output, label: str) -> Callable[[Progress], None]:
    def report(p: Progress) -> None:
        eta = f"{p.eta_s:.0f}s" if p.eta_s != float("inf") else "?"
        end = "\n" if p.done >= p.total else ""
        print(
            f"\r{label}: {p.done:,}/{p.total:,} tokens · {p.tokens_per_s:,.0f} tok/s · "
            f"ETA {eta}   ",
            end=end,
            file=sys.stderr,
            flush=True,
        )

    return report


@contextmanager
def _cancel_on_sigint() -> Iterator[threading.Event]:
    """Ctrl-C stops generation between tokens instead of killing the process mid-write."""
    cancel = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        cancel.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


def passphrase_for(args: argparse.Namespace, data_dir: Path) -> str | None:
    """The passphrase when the data directory uses one (or --passphrase asks for it)."""
    from galahad_desktop.vault.keys import keystore_mode_file

    if not (args.passphrase or keystore_mode_file(data_dir).exists()):
        return None
    env = os.environ.get("GALAHAD_PASSPHRASE")
    if env:
        return env
    if not sys.stdin.isatty():
        raise KeyAccessError(
            f"{data_dir} uses a passphrase: set GALAHAD_PASSPHRASE or run interactively."
        )
    import getpass

    return getpass.getpass("Passphrase for Galahad: ")


def _open(args: argparse.Namespace) -> Any:
    from galahad_desktop.memory.service import Galahad

    data_dir = args.data_dir or default_data_dir()
    return Galahad(
        data_dir,
        model_path=args.model,
        overrides=_parse_pairs(args.set),
        passphrase=passphrase_for(args, data_dir),
    )


def _turn_text(result: Any) -> str:
    parts = []
    if result.graft is not None:
        parts.append(result.graft.describe())
    c = result.counters
    parts.append(
        f"{c.generated_tokens} tokens at {result.tokens_per_s:.1f} tok/s · "
        f"context {result.context_tokens:,} tokens"
    )
    return " · ".join(parts)


def _run_turn(
    core: Any, out: Output, conversation_id: str, message: str, args: argparse.Namespace
) -> dict[str, Any]:
    params = core.sampling(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    stream = None if out.as_json else (lambda piece: print(piece, end="", flush=True))
    with _cancel_on_sigint() as cancel:
        result = core.send(
            conversation_id,
            message,
            on_text=stream,
            cancel=cancel,
            params=params,
            progress=_progress(out, "re-reading"),
        )
    if result.graft and result.graft.fallback_reason:
        out.info(f"Note: re-read the conversation because {result.graft.fallback_reason}.")
    if not out.as_json:
        print()
        out.info(_turn_text(result))
    obj = dict(result.as_dict())
    if core.needs_compaction(conversation_id):  # after the reply is out: the user has it
        obj["compaction"] = core.compact(conversation_id)
    return obj


def cmd_chat(core: Any, out: Output, args: argparse.Namespace) -> int:
    conversation_id = args.conversation or core.new_conversation(document_id=args.document)
    if args.message is not None:
        obj = _run_turn(core, out, conversation_id, args.message, args)
        if out.as_json:
            out.result(obj, "")
        return 0
    if args.conversation:
        report = core.resume(conversation_id, progress=_progress(out, "re-reading"))
        out.info(report.describe())
        for message in core.messages(conversation_id)[-6:]:
            out.info(f"{message.role}> {message.text}")
    out.info(f"Conversation {conversation_id}. Type /quit to leave; Ctrl-C stops a reply.")
    while True:
        try:
            line = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print()
            break
        if line.strip() in ("/quit", "/exit"):
            break
        if not line.strip():
            continue
        print("model> ", end="", flush=True)
        try:
            _run_turn(core, out, conversation_id, line, args)
        except GalahadError as exc:
            out.info(f"error: {exc}")
    return 0


def cmd_self_test(args: argparse.Namespace, out: Output) -> int:
    """Deposit a small document, resume it in a fresh engine, require an exact proof."""
    import tempfile

    from galahad_desktop.memory.service import Galahad
    from galahad_desktop.vault.keys import MemoryKeyStore

    keystore = MemoryKeyStore()  # a throwaway key: the self-test must not touch the keyring
    with tempfile.TemporaryDirectory(prefix="galahad-self-test-") as tmp:
        doc = Path(tmp) / "self-test.txt"
        doc.write_text("Galahad self-test. The access code of the vault is 4711.\n" * 20)
        data = Path(tmp) / "data"
        first = Galahad(
            data, model_path=args.model, keystore=keystore, overrides=_parse_pairs(args.set)
        )
        try:
            deposited = first.deposit(doc)
            backend = first.engine.fingerprint_details["system_info"]
        finally:
            first.close()
        second = Galahad(
            data, model_path=args.model, keystore=keystore, overrides=_parse_pairs(args.set)
        )
        try:
            conversation = second.new_conversation(document_id=deposited.document_id)
            report = second.resume(conversation)
            # A turn stored as a chain link on the document's block, spliced back exactly.
            second.send(conversation, "Thank you.", params=second.sampling(max_tokens=4))
            chained = second.resume(conversation)
            links = second.chain_links(conversation) + 1
            # The router (SQLite FTS5, in memory) over the stored part.
            routed = second.ask(
                "What is the access code of the vault?", params=second.sampling(max_tokens=4)
            )
        finally:
            second.close()
    ok = (
        report.proof.verdict == "exact"
        and report.recomputed_tokens == 0
        and chained.proof.verdict == "exact"
        and chained.recomputed_tokens == 0
        and links == 2
        and routed.answered
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
            "backend": backend,
        },
        f"self-test {'passed' if ok else 'FAILED'}: {deposited.tokens} tokens, {report.describe()}",
    )
    return 0 if ok else 1


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--sizes must be comma-separated token counts, got '{text}'.") from None
    if not sizes or min(sizes) < 64:
        raise InputError("--sizes needs token counts of at least 64.")
    return sizes


def cmd_measure(args: argparse.Namespace, out: Output) -> int:
    """Benchmarks and evaluations: print a table (or one JSON object), save JSON (and a plot)."""
    import time as _time

    from galahad_desktop.bench import benchmarks, needles

    overrides = _parse_pairs(args.set)
    name = f"{args.command}-{args.kind}"
    if args.command == "bench" and args.kind == "resume":
        result = benchmarks.bench_resume(
            _sizes(args.sizes), args.reps, args.model, overrides, out.info
        )
        text = benchmarks.resume_table(result)
    elif args.command == "bench" and args.kind == "persist":
        result = benchmarks.bench_persist(
            _sizes(args.sizes), args.turns, args.model, overrides, out.info
        )
        text = "\n".join(
            f"{r['size']:>7,} tokens: per-turn save as a chain link {r['chain_persist_ms']:.0f} ms "
            f"({r['chain_block_bytes'] / 1e6:.2f} MB), as a whole state "
            f"{r['whole_persist_ms']:.0f} ms ({r['whole_block_bytes'] / 1e6:.1f} MB): "
            f"{r['whole_over_chain']:.1f}x"
            for r in result["summary"]
        )
    elif args.command == "bench":
        result = benchmarks.bench_deposit(
            _sizes(args.sizes), args.reps, args.model, overrides, out.info
        )
        text = "\n".join(
            f"{r['tokens']:>7,} tokens: raw prefill {r['raw_prefill_ms']:.0f} ms, "
            f"deposit {r['deposit_ms']:.0f} ms ({r['overhead_percent']:+.1f}%)"
            for r in result["results"]
        )
    elif args.kind == "flywheel":
        from galahad_desktop.bench.flywheel import eval_flywheel

        result = eval_flywheel(
            args.problems,
            args.attempts,
            args.seed,
            args.model,
            overrides,
            out.info,
            oracle=args.oracle,
        )
        text = (
            f"{result['problems']} problems, {result['solved_and_stored']} verified and "
            f"stored ({result['solved_by_model']} solved by the model) using "
            f"{result['first_decode_tokens']} decode tokens; recurrence "
            f"{result['recurrence_correct']}/{result['solved_and_stored']} correct with "
            f"{result['recurrence_decode_tokens']} decode tokens; transfer "
            f"{result['transfer_correct']} correct with {result['transfer_decode_tokens']} "
            f"decode tokens; near misses {result['near_misses']}: "
            f"{result['gate_wrong_answers']} wrong stored answers"
        )
    elif args.kind == "memory":
        from galahad_desktop.bench.memory_eval import eval_memory

        result = eval_memory(
            args.tokens,
            args.probes,
            20 if args.controls is None else args.controls,
            args.doc_tokens,
            args.seed,
            args.model,
            overrides,
            out.info,
        )
        text = (
            f"{result['tokens']:,} tokens in {result['parts']} parts; probes {result['probes']}: "
            f"routed right {result['routed_right']}, answered {result['answered']} (gate "
            f"refusals {result['gate_refusals']}), zero recompute {result['zero_recompute']}, "
            f"exact {result['exact']}; controls {result['controls']}: gated "
            f"{result['controls_gated']}, fabricated {result['fabricated']}; RSS "
            f"{result['rss_start_mb']:.0f} -> {result['rss_end_mb']:.0f} MB"
        )
    elif args.kind in ("tamper", "crashes", "hostile"):
        from galahad_desktop import hardening

        if args.kind == "tamper":
            result = hardening.tamper_fuzz(args.mutations, args.seed, out.info)
            text = (
                f"{result['mutations']} mutations: {result['refused']} refused, "
                f"{result['grafted']} grafted, {result['crashed']} crashed"
            )
        elif args.kind == "crashes":
            result = hardening.crash_trials(args.trials, args.seed, out.info)
            text = (
                f"{result['trials']} trials ({result['killed']} killed mid-operation): "
                f"{result['survived']} survived"
            )
        else:
            result = hardening.eval_hostile(out.info)
            text = (
                f"{result['inputs']} hostile inputs: {result['refused']} refused, "
                f"{result['read']} read within limits, {result['crashed']} crashed; "
                f"slowest {result['slowest_s']:.1f}s; cancel "
                f"{'honoured' if result['cancel_honoured'] else 'IGNORED'} in "
                f"{result['cancel_s']:.2f}s"
            )
    else:
        result = needles.eval_needles(
            args.blocks,
            args.block_tokens,
            16 if args.controls is None else args.controls,
            args.seed,
            args.model,
            overrides,
            out.info,
        )
        text = (
            f"probes {result['probes']}: zero recompute {result['zero_recompute']}, exact "
            f"{result['exact']}; controls {result['controls']}: fabricated "
            f"{result['fabricated']}; restore {result['restore_vs_prefill']:.0f}× faster "
            "than prefill"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = _time.strftime("%Y%m%d-%H%M%S")
    result["saved_to"] = str(args.out / f"{name}.json")
    for path in (args.out / f"{name}.json", args.out / f"{name}-{stamp}.json"):
        path.write_text(json.dumps(result, indent=1, default=str))
    plotted = name != "bench-resume" or benchmarks.plot_resume(
        result, args.out / "bench-resume.png"
    )
    if not plotted:
        out.info("No plot: install the 'bench' extra (matplotlib) for bench-resume.png.")
    out.result(result, text)
    return 0


def cmd_verified(core: Any, args: argparse.Namespace, out: Output) -> int:
    from dataclasses import asdict

    from galahad_desktop.memory.library import VerifiedLibrary

    library = VerifiedLibrary(core)
    items = list(args.items)
    if args.action in ("add", "check"):
        if len(items) != 2:
            raise InputError(f"verified {args.action} needs QUESTION and ANSWER.")
        if args.action == "check":
            verdict = library.check(items[0], items[1])
            if verdict is None:
                out.result({"checkable": False}, "No verifier can check this question.")
                return 0
            out.result(
                {"checkable": True, **asdict(verdict)},
                f"{'passes' if verdict.ok else 'FAILS'} its {verdict.verifier} check "
                f"(expected {verdict.expected})",
            )
            return 0 if verdict.ok else 1
        entry = library.add(items[0], items[1], user_verified=args.user_verified)
        out.result(asdict(entry), f"Stored verified answer {entry.id} ({entry.verifier}).")
        return 0
    if args.action == "list":
        entries = [asdict(e) for e in library.entries()]
        out.result(
            {"entries": entries},
            "\n".join(
                f"{e['id']}  uses {e['uses']:>3}  {e['question']} -> {e['answer']}" for e in entries
            )
            or "The library is empty.",
        )
        return 0
    if args.action == "remove":
        if len(items) != 1:
            raise InputError("verified remove needs the entry's id.")
        library.remove(items[0])
        out.result({"removed": items[0]}, f"Removed {items[0]}.")
        return 0
    if len(items) != 1:
        raise InputError("verified ask needs one QUESTION.")
    conversation = args.conversation or core.new_conversation()
    params = core.sampling(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    result = library.ask(conversation, items[0], params=params)
    label = (result.library or {}).get("label") or "answered by the model"
    out.result(
        result.as_dict(),
        f"{result.reply}\n({label}; {result.counters.generated_tokens} decode tokens)",
    )
    return 0


def cmd_models(args: argparse.Namespace, out: Output) -> int:
    from galahad_desktop.models import download_gguf
    from galahad_desktop.settings import Settings

    data_dir = args.data_dir or default_data_dir()
    start = time.monotonic()

    def report(have: int, total: int) -> None:
        _progress(out, "downloading")(Progress(have, total, time.monotonic() - start))

    with _cancel_on_sigint() as cancel:
        done = download_gguf(
            args.repo_id,
            args.filename,
            data_dir / "models",
            revision=args.revision,
            progress=report,
            cancel=cancel,
        )
    if args.use:
        Settings(data_dir).update({"model_path": str(done.path)})
    out.result(
        {
            "path": str(done.path),
            "sha256": done.sha256,
            "bytes": done.size,
            "resumed_from": done.resumed_from,
            "in_use": bool(args.use),
        },
        f"Downloaded {done.path} ({done.size / 1e6:.0f} MB, SHA-256 verified)",
    )
    return 0


def dispatch(args: argparse.Namespace, out: Output) -> int:
    if args.self_test:
        return cmd_self_test(args, out)
    command = args.command or "gui"
    if command in ("bench", "eval"):
        return cmd_measure(args, out)
    if command == "gui":
        from galahad_desktop.ui.app import run_app

        return int(run_app(data_dir=args.data_dir, model_path=args.model))
    if command == "models":
        return cmd_models(args, out)
    if command == "settings" and not args.changes:
        from galahad_desktop.settings import SETTINGS, Settings

        settings = Settings(args.data_dir or default_data_dir())
        values = settings.as_dict()
        out.result(
            {"settings": values},
            "\n".join(f"{s.key} = {values[s.key]!r}  # {s.description}" for s in SETTINGS),
        )
        return 0
    core = _open(args)
    try:
        return _dispatch_core(core, command, args, out)
    finally:
        core.close()


def cmd_ask(core: Any, out: Output, args: argparse.Namespace) -> int:
    if args.question is None:
        document_id, question = None, args.target
    else:
        document_id, question = args.target, args.question
    if document_id is not None and args.part is None:
        doc = core.vault.catalog.get("documents", document_id)
        if doc is not None and (doc.get("n_parts") or 1) == 1:
            # One part: no routing to do; a conversation on the document, as before.
            conversation_id = core.new_conversation(document_id=document_id)
            obj = _run_turn(core, out, conversation_id, question, args)
            if out.as_json:
                out.result(obj, "")
            return 0
    params = core.sampling(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    stream = None if out.as_json else (lambda piece: print(piece, end="", flush=True))
    result = core.ask(question, document_id, args.part, on_text=stream, params=params)
    obj = result.as_dict()
    if not result.answered:
        d = result.decision
        lines = [f"Not answered: {d.reason}. Candidates (answer with --part ID):"]
        for c in d.candidates:
            lines.append(
                f"  {c.part_id}  {core.citation(c.part_id)}  share {c.coverage:.2f}  "
                f"BM25 {c.score:.2f}"
            )
        if not d.candidates:
            lines.append("  (none)")
        obj["candidates_cited"] = [core.citation(c.part_id) for c in d.candidates]
        out.result(obj, "\n".join(lines))
        return GATED_EXIT
    if not out.as_json:
        print()
    graft = result.graft
    restored = graft.restored_tokens if graft else 0
    out.result(
        obj,
        f"[{result.citation} · restored {restored:,} tokens, recomputed "
        f"{graft.recomputed_tokens if graft else 0:,} · "
        f"{graft.proof.verdict if graft else 'already loaded'}]",
    )
    return 0


def _dispatch_core(core: Any, command: str, args: argparse.Namespace, out: Output) -> int:
    if command == "deposit":
        result = core.deposit(args.file, progress=_progress(out, "reading"))
        obj = result.as_dict()
        out.result(
            obj,
            f"Stored document {result.document_id} '{result.name}': "
            f"{result.tokens:,} tokens read in {result.prefill_ms / 1e3:.1f} s, "
            + (f"{result.n_parts} parts, blocks " if result.n_parts > 1 else "block ")
            + f"{result.block_bytes / 1e6:.1f} MB",
        )
        return 0
    if command == "ask":
        return cmd_ask(core, out, args)
    if command == "add-document":
        turn = core.add_document_file(
            args.conversation_id, args.file, progress=_progress(out, "reading")
        )
        c = turn.counters
        out.result(
            {**turn.as_dict(), "links": core.chain_links(args.conversation_id)},
            f"Added '{args.file.name}' to {args.conversation_id}: read {c.new_tokens:,} new "
            f"tokens, restored {c.restored_tokens:,}, recomputed {c.recomputed_tokens:,}.",
        )
        return 0
    if command == "compact":
        obj = core.compact(args.conversation_id, args.keep)
        text = (
            f"Merged {obj['merged']} links into one; the chain now has {obj['links_after']}."
            if obj["merged"]
            else f"Nothing to merge ({obj['links_before']} links)."
            + (f" {obj['skipped']}." if obj.get("skipped") else "")
        )
        out.result(obj, text)
        return 0
    if command == "routing-log":
        entries = core.routing_log(args.limit)
        out.result(
            {"entries": entries},
            "\n".join(
                f"{e['decision']:>8}  best {e['best_score']:.2f}  margin "
                f"{e['margin']:.2f}  {e['scope']}  -> {e['part_id']}"
                for e in entries
            )
            or "No routing decisions yet.",
        )
        return 0
    if command == "chat":
        return cmd_chat(core, out, args)
    if command == "resume":
        report = core.resume(args.conversation_id, progress=_progress(out, "re-reading"))
        obj = report.as_dict()
        obj["conversation_id"] = args.conversation_id
        out.result(obj, report.describe())
        return 0
    if command == "list":
        conversations = [c.__dict__ for c in core.list_conversations()]
        documents = [d.__dict__ for d in core.list_documents()]
        lines = [
            f"{c['id']}  {c['n_tokens']:>7,} tok  {c['title'] or '(untitled)'}"
            for c in conversations
        ]
        lines += [
            f"{d['id']}  {d['n_tokens']:>7,} tok  {d['name']}"
            + (f"  ({d['n_parts']} parts)" if d["n_parts"] > 1 else "")
            for d in documents
        ]
        out.result(
            {"conversations": conversations, "documents": documents},
            "\n".join(lines) or "Nothing stored yet.",
        )
        return 0
    if command == "show":
        messages = [m.__dict__ for m in core.messages(args.conversation_id)]
        out.result(
            {"conversation_id": args.conversation_id, "messages": messages},
            "\n".join(f"{m['role']}> {m['text']}" for m in messages),
        )
        return 0
    if command == "verify":
        if not args.all and not args.id:
            raise InputError("Give an id to verify, or --all.")
        results = core.verify(None if args.all else args.id)
        ok = all(r["proof"] in ("exact", "close") for r in results)
        out.result(
            {"results": results, "ok": ok, "fingerprint": core.engine.fingerprint},
            "\n".join(
                f"{r['block_id']} ({r['kind']} {r['owner_id']}, {r['tokens']:,} "
                f"tokens): {r['proof']}"
                for r in results
            )
            or "No blocks.",
        )
        return 0 if ok else 1
    if command == "audit":
        report = core.vault.audit(repair=args.repair)
        obj = report.as_dict()
        text = (
            f"{report.ok}/{report.blocks} blocks ok"
            + "".join(f"\nproblem: {p}" for p in report.problems)
            + "".join(f"\nrepaired: {r}" for r in report.repaired)
        )
        out.result(obj, text)
        return 0 if not report.problems else 1
    if command == "forget":
        obj = core.forget(args.id)
        out.result(obj, f"Forgot {obj['kind']} {args.id} ({obj['blocks']} blocks deleted).")
        return 0
    if command == "keys":
        if args.action == "rotate":
            blocks = len(core.vault.catalog.rows("blocks"))
            key_id = core.vault.rotate_master_key()
            out.result(
                {"rotated": True, "key_id": key_id, "blocks_rewrapped": blocks},
                f"Rotated the master key; re-wrapped {blocks} block keys.",
            )
        else:
            out.result(
                {"backend": core.vault.keystore.backend_name, "key_id": core.vault.key_id},
                f"Master key {core.vault.key_id} in {core.vault.keystore.backend_name}",
            )
        return 0
    if command == "settings":
        changed = core.settings.update(_parse_pairs(args.changes))
        note = " Stored blocks will be re-read on next use." if changed else ""
        out.result(
            {"settings": core.settings.as_dict(), "runtime_changed": changed}, f"Saved.{note}"
        )
        return 0
    if command == "verified":
        return cmd_verified(core, args, out)
    if command == "info":
        engine = core.engine
        info = engine.model_info().__dict__
        out.result(
            {
                "model": info,
                "fingerprint": engine.fingerprint,
                "fingerprint_details": engine.fingerprint_details,
                "gpu_layers": engine.gpu_layers,
            },
            f"{info['description']} ({info['n_params'] / 1e6:.0f}M params) · "
            f"fingerprint {engine.fingerprint[:16]} · {engine.backend} backend, "
            f"{engine.gpu_layers} layers offloaded",
        )
        return 0
    raise InputError(f"Unknown command '{command}'.")


def main(argv: Sequence[str] | None = None) -> int:
    # Everything this process creates (ours, SQLite's, Qt's, logging's) is private.
    os.umask(0o077)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--extract-worker"] and len(argv) == 2:  # frozen app's document reader
        from galahad_desktop.memory.extract_worker import run

        return run(argv[1])
    args = build_parser().parse_args(argv)
    out = Output(bool(args.json))
    try:
        return dispatch(args, out)
    except GalahadError as exc:
        print(f"galahad: {exc}", file=sys.stderr)
        if out.as_json:
            print(json.dumps({"error": str(exc), "kind": type(exc).__name__}))
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
