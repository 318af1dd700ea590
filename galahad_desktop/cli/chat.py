"""Conversations from the terminal: chat, resume, list, show, rename, compact."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from galahad_desktop.cli.common import (
    Output,
    command_job,
    progress_printer,
    sampling_of,
)
from galahad_desktop.errors import (
    ContextFullError,
    DeviceLostError,
    GalahadError,
    InputError,
)
from galahad_desktop.jobs import Job
from galahad_desktop.memory.results import Message, TurnResult

if TYPE_CHECKING:  # imported when a command runs: --help stays quick
    from galahad_desktop.memory.galahad import Galahad


def make_room(
    core: Galahad, out: Output, conversation_id: str, message: str, when_full: str
) -> str:
    """The conversation the message goes to: this one when it fits; else, as chosen, a
    continuation (from a summary, or with the documents and the last turns)."""
    full = core.context_check(conversation_id, message)
    if full is None:
        return conversation_id
    if when_full not in ("stop", "summary", "recent"):
        raise InputError("--when-full takes stop, summary or recent.")
    offered = [o.kind for o in full.options if o.kind != "stop"]
    if when_full not in offered:  # stop, or a way on that cannot work for this message
        hint = " or ".join(f"--when-full {kind}" for kind in offered)
        raise ContextFullError(full.describe() + (f" Send again with {hint}." if hint else ""))
    if when_full == "summary":
        with command_job(out, "summarizing") as job:
            continued = core.continue_with_summary(conversation_id, job)
    else:
        with command_job(out, "re-reading") as job:
            continued = core.continue_with_recent(conversation_id, message, job)
    out.info(
        f"Continued in {continued.conversation_id} ({continued.kind}, re-read "
        f"{continued.reread_tokens:,} tokens)."
    )
    return str(continued.conversation_id)


def run_turn(
    core: Galahad,
    out: Output,
    conversation_id: str | None,
    message: str,
    args: argparse.Namespace,
) -> TurnResult:
    """One turn; without a conversation, the first turn of a new one (made with it, so a
    turn that fails leaves none behind)."""
    if conversation_id is not None:
        conversation_id = make_room(
            core, out, conversation_id, message, getattr(args, "when_full", "stop")
        )
    params = sampling_of(core, args)
    with command_job(out, "re-reading", answer=True) as job:
        result = core.send(
            conversation_id,
            message,
            job,
            params,
            compact=True,  # after the reply is out: the user has it
            thinking=getattr(args, "thinking", None),
            system_prompt=getattr(args, "system", None),
        )
    if result.graft and result.graft.fallback_reason:
        out.info(f"Note: re-read the conversation because {result.graft.fallback_reason}.")
    if not out.as_json:
        print()
        out.info(result.describe())
    for call in result.calls:  # tools run from the window, where each call is asked first
        out.info(
            f"The reply called the tool {call.name}({json.dumps(call.arguments)}); tools run "
            "from the window (galahad gui), where each call is asked first. The next message "
            "here answers it as not run."
        )
    return result


CHAT_HELP = """Commands:
  /help        this list
  /new         start a new conversation
  /list        your conversations, numbered
  /resume N    continue conversation N of /list (or its id)
  /quit        leave (Ctrl-D too); Ctrl-C stops a reply"""


def cmd_chat(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    info = core.info()  # the model loads first: one that does not leaves nothing behind
    conversation_id: str | None = args.conversation
    stacked: list[str] = list(args.document or [])
    if conversation_id is None and stacked:
        conversation_id = core.new_conversation(
            document_id=stacked.pop(0), system_prompt=args.system, thinking=args.thinking
        )
    if conversation_id is not None and stacked:  # the others stacked, never read again
        with command_job(out, "stacking") as job:
            turn = core.add_stored_documents(conversation_id, stacked, job)
        if turn.stack is not None:
            out.info(turn.stack.describe())
    if args.conversation and args.thinking is not None:
        core.set_thinking(args.conversation, args.thinking)
    if args.message is not None:
        result = run_turn(core, out, conversation_id, args.message, args)
        if out.as_json:
            out.result(result, "")
        # A reply cut by a lost device server is stored, but the command did not do all it
        # was asked: it says so (describe() names the problem) and exits as a model error.
        return DeviceLostError.exit_code if result.stop_reason == "device_lost" else 0
    if info.model.kind != "chat":
        out.info(f"Model: {info.model.name} — a {info.model.label}.")
    if conversation_id is not None:
        show_resumed(core, out, conversation_id)
    out.info(
        (f"Conversation {conversation_id}. " if conversation_id else "A new conversation. ")
        + "Type /help for commands, /quit to leave; Ctrl-C stops a reply."
    )
    listed: list[str] = []
    while True:
        try:
            line = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print()
            break
        command, _, rest = line.strip().partition(" ")
        if command in ("/quit", "/exit"):
            break
        if not line.strip():
            continue
        if command.startswith("/") and command[1:].isalpha():
            try:
                conversation_id, listed = chat_command(
                    core, out, command, rest.strip(), conversation_id, listed
                )
            except GalahadError as exc:
                out.info(f"error: {exc}")
            continue
        print("model> ", end="", flush=True)
        try:
            conversation_id = run_turn(core, out, conversation_id, line, args).conversation_id
        except GalahadError as exc:
            out.info(f"error: {exc}")
    return 0


def show_resumed(core: Galahad, out: Output, conversation_id: str) -> None:
    report = core.resume(conversation_id, Job(on_progress=progress_printer("re-reading")))
    out.info(report.describe())
    for message in core.messages(conversation_id)[-6:]:
        out.info(f"{message.role}> {message.text}")


def chat_command(
    core: Galahad,
    out: Output,
    command: str,
    argument: str,
    conversation_id: str | None,
    listed: list[str],
) -> tuple[str | None, list[str]]:
    """A /command of the terminal chat: (the conversation now, the last /list's ids)."""
    if command == "/help":
        out.info(CHAT_HELP)
    elif command == "/new":
        out.info("A new conversation: it is stored with its first message.")
        return None, listed
    elif command == "/list":
        conversations = core.list_conversations()
        listed = [c.id for c in conversations]
        for number, c in enumerate(conversations, start=1):
            mark = "*" if c.id == conversation_id else " "
            out.info(f"{mark}{number:>3}  {c.title or '(untitled)'}  ({c.n_messages} messages)")
        if not conversations:
            out.info("No conversations yet.")
    elif command == "/resume":
        if not argument:
            raise InputError("Say which: /resume N (a number from /list) or an id.")
        if argument.isdigit():
            listed = listed or [c.id for c in core.list_conversations()]
            number = int(argument)
            if not 1 <= number <= len(listed):
                raise InputError(f"There is no conversation {number}; /list shows them.")
            argument = listed[number - 1]
        show_resumed(core, out, argument)
        return argument, listed
    else:
        out.info(f"Unknown command {command}; /help lists them.")
    return conversation_id, listed


def cmd_resume(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    report = core.resume(args.conversation_id, Job(on_progress=progress_printer("re-reading")))
    out.result({**report.as_dict(), "conversation_id": args.conversation_id}, report.describe())
    return 0


def cmd_list(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    conversations = core.list_conversations()
    documents = core.list_documents()
    lines = [
        f"{c.id}  {c.n_tokens:>7,} tok  {c.title or '(untitled)'}"
        + (f"  [damaged: {c.damaged}; run galahad audit]" if c.damaged else "")
        for c in conversations
    ]
    lines += [
        f"{d.id}  {d.n_tokens:>7,} tok  {d.name}"
        + (f"  ({d.n_parts} {'pages' if d.kind == 'scan' else 'parts'})" if d.n_parts > 1 else "")
        + ("  (picture)" if d.kind == "picture" else "")
        + ("  (voice memo)" if d.kind == "memo" else "")
        for d in documents
    ]
    out.result(
        {"conversations": conversations, "documents": documents},
        "\n".join(lines) or "Nothing stored yet.",
    )
    return 0


def cmd_show(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    messages = core.messages(args.conversation_id)
    summary = core.conversation(args.conversation_id)
    out.result(
        {"conversation_id": args.conversation_id, "title": summary.title, "messages": messages},
        "\n".join(f"{m.role}> {shown_text(m)}" for m in messages),
    )
    return 0


def shown_text(message: Message) -> str:
    """A message as `show` prints it: a reply that called tools says which, with what."""
    if not message.calls:
        return message.text
    calls = "; ".join(
        f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in message.calls
    )
    return (f"{message.text} " if message.text else "") + f"[called {calls}]"


def cmd_rename(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    summary = core.rename(args.conversation_id, args.title)
    out.result(summary, f"Renamed {summary.id} to '{summary.title}'.")
    return 0


def cmd_import(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    with command_job(out, "reading") as job:
        result = core.import_conversations(args.file, job)
    lines = [
        f"Imported {len(result.conversations)} conversation(s), {result.tokens:,} tokens read "
        f"at {result.tokens_per_s:,.0f} tok/s"
        + (" (cancelled: the rest was not imported)" if result.cancelled else "")
        + "."
    ]
    lines += [
        f"  {c.conversation_id}  {c.messages:>3} messages  {c.title}" for c in result.conversations
    ]
    lines += [f"  skipped '{s.title}': {s.reason}" for s in result.skipped]
    lines += [
        f"  note on '{c.title}': left out {reason}"
        for c in result.conversations
        for reason in c.left_out
    ]
    out.result(result, "\n".join(lines))
    if not result.conversations and result.skipped and not result.cancelled:
        # Nothing came in: said as a failure (exit 4), not as a success of nothing.
        raise InputError(
            f"Nothing was imported from {args.file}: all {len(result.skipped)} "
            "conversation(s) in it were skipped (the reasons are above)."
        )
    return 0


def cmd_export(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    result = core.export(args.conversation_id, args.format, args.out, args.force)
    if result.path is None:
        if out.as_json:
            out.result(result, "")
        else:
            print(result.text)
        return 0
    out.info("The export is plain text: keep it somewhere private.")
    out.result(
        {
            "path": result.path,
            "format": result.format,
            "messages": result.messages,
            "bytes": result.bytes,
        },
        f"Exported {result.messages} messages to {result.path}.",
    )
    return 0


def cmd_compact(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    result = core.compact(args.conversation_id, args.keep)
    text = (
        f"Merged {result.merged} links into one; the chain now has {result.links_after}."
        if result.merged
        else f"Nothing to merge ({result.links_before} links)."
        + (f" {result.skipped}." if result.skipped else "")
    )
    out.result(result, text)
    return 0


def register(add: Any) -> None:
    from pathlib import Path

    from galahad_desktop.cli.common import add_sampling

    p = add("chat", "streaming chat in the terminal, or one turn with --message", cmd_chat)
    p.add_argument("--conversation", help="continue this conversation")
    p.add_argument(
        "--document",
        action="append",
        metavar="ID",
        help="start a conversation on this stored document; given again, the others are "
        "stacked after it without reading them again",
    )
    p.add_argument("--message", help="send one message and exit")
    p.add_argument(
        "--system",
        help="a new conversation's system prompt: your own words, or a preset's name "
        "(concise, coder, tutor, translator); kept encrypted",
    )
    thinking = p.add_mutually_exclusive_group()
    thinking.add_argument(
        "--thinking",
        dest="thinking",
        action="store_true",
        default=None,
        help="let the model think first (Gemma 4; a new conversation)",
    )
    thinking.add_argument("--no-thinking", dest="thinking", action="store_false")
    p.add_argument(
        "--when-full",
        default="stop",
        choices=["stop", "summary", "recent"],
        help="when the message does not fit the context: stop (default, exit 12), continue "
        "in a new conversation from a summary, or with the documents and the last turns",
    )
    add_sampling(p)
    p = add("resume", "graft a stored conversation and report what it cost", cmd_resume)
    p.add_argument("conversation_id")
    add("list", "list conversations and documents", cmd_list)
    p = add("show", "print a conversation's messages", cmd_show)
    p.add_argument("conversation_id")
    p = add("rename", "give a conversation a new title", cmd_rename)
    p.add_argument("conversation_id")
    p.add_argument("title")
    p = add(
        "import",
        "import conversations: a ChatGPT conversations.json, a Jan thread folder, an LM Studio "
        ".conversation.json, an Open WebUI export, a Markdown transcript or a Galahad export",
        cmd_import,
    )
    p.add_argument("file", type=Path)
    p = add("export", "export a conversation as Markdown, JSON (re-importable) or HTML", cmd_export)
    p.add_argument("conversation_id")
    p.add_argument("--format", default="md", choices=["md", "json", "html"])
    p.add_argument("--out", type=Path, help="file to write (default: print it)")
    p.add_argument("--force", action="store_true", help="replace the file if it exists")
    p = add("compact", "merge a conversation's older chain links into one block", cmd_compact)
    p.add_argument("conversation_id")
    p.add_argument("--keep", type=int, help="newest turn links kept separate (default: setting)")
