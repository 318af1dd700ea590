"""Chat history in other apps' formats: read (import) and write (export).

Read: ChatGPT's data export (`conversations.json`, following each conversation's current
branch through its message tree), Jan threads (`threads/<id>/thread.json` with
`messages.jsonl`), LM Studio conversation files (`*.conversation.json`, the selected version
of each message), Open WebUI's JSON export (the current branch of its history tree), a
Markdown transcript, and Galahad's own JSON export. The format is detected from the content,
never from the file name alone. Everything here is pure: text in, conversations out.

Write: Markdown, HTML and Galahad JSON (which `import` reads back exactly).
"""

from __future__ import annotations

import html
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from galahad_desktop.errors import InputError
from galahad_desktop.system.files import read_regular_file

MAX_IMPORT_BYTES = 512 * 1024 * 1024
MAX_MESSAGES = 100_000
GALAHAD_FORMAT = "galahad-conversation"


@dataclass
class ImportedMessage:
    role: str  # user | model
    text: str
    created_at: float | None = None


@dataclass
class ImportedConversation:
    title: str
    messages: list[ImportedMessage]
    created_at: float | None = None
    updated_at: float | None = None
    source: str = ""
    dropped: list[str] = field(default_factory=list)  # what was left out, and why


def _time(value: Any) -> float | None:
    """Seconds since the epoch from a number (s or ms) or an ISO date; None if unreadable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = float(value)
        return seconds / 1000 if seconds > 1e11 else seconds
    if isinstance(value, str):
        text = value.strip()
        try:
            return _time(float(text))
        except ValueError:
            pass
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    return None


_ROLES = {
    "user": "user",
    "human": "user",
    "you": "user",
    "me": "user",
    "assistant": "model",
    "model": "model",
    "gemma": "model",
    "ai": "model",
    "bot": "model",
    "chatgpt": "model",
    "gpt": "model",
}


def _role(value: Any) -> str | None:
    return _ROLES.get(str(value or "").strip().lower())


def _text_of(content: Any) -> str:
    """Text from the content shapes the formats use: a string, a list of strings or parts
    ({"type": "text", "text": ...}, {"text": {"value": ...}}), or {"parts": [...]}."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (_text_of(item) for item in content) if t)
    if isinstance(content, dict):
        if "parts" in content:
            return _text_of(content["parts"])
        kind = content.get("type")
        if kind not in (None, "text", "input_text", "output_text"):
            return ""
        text = content.get("text")
        if isinstance(text, dict):
            return str(text.get("value", ""))
        if isinstance(text, str):
            return text
        if "content" in content:
            return _text_of(content["content"])
    return ""


def _clean(text: str, dropped: list[str]) -> str:
    """What the model can read faithfully: NULs removed and broken surrogates replaced,
    each said in the import report."""
    if "\x00" in text:
        dropped.append(f"{text.count(chr(0))} NUL character(s) removed")
        text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        dropped.append("broken characters (unpaired surrogates) replaced")
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text.strip()


def normalize(conversation: ImportedConversation) -> ImportedConversation:
    """User and model turns alternating, starting with the user: consecutive messages of
    one role are joined; what cannot be placed is listed in `dropped`."""
    merged: list[ImportedMessage] = []
    for message in conversation.messages:
        text = _clean(message.text, conversation.dropped)
        if not text:
            continue
        if merged and merged[-1].role == message.role:
            merged[-1].text += "\n\n" + text
            continue
        merged.append(ImportedMessage(message.role, text, message.created_at))
    while merged and merged[0].role != "user":
        conversation.dropped.append("a model message before the first user message")
        merged.pop(0)
    if merged and merged[-1].role == "user":
        conversation.dropped.append("a last user message that was never answered")
        merged.pop()
    conversation.messages = merged
    return conversation


# -- the formats ---------------------------------------------------------------------------


def _chatgpt(data: list[Any]) -> list[ImportedConversation]:
    out = []
    for item in data:
        mapping = item.get("mapping") or {}
        node_id = item.get("current_node")
        chain: list[dict[str, Any]] = []
        seen: set[str] = set()
        while isinstance(node_id, str) and node_id in mapping and node_id not in seen:
            seen.add(node_id)
            node = mapping[node_id] or {}
            if node.get("message"):
                chain.append(node["message"])
            node_id = node.get("parent")
        messages = []
        for message in reversed(chain):
            role = _role((message.get("author") or {}).get("role"))
            metadata = message.get("metadata") or {}
            if role is None or metadata.get("is_visually_hidden_from_conversation"):
                continue
            content = message.get("content") or {}
            if content.get("content_type") not in (None, "text", "multimodal_text"):
                continue
            messages.append(
                ImportedMessage(role, _text_of(content), _time(message.get("create_time")))
            )
        out.append(
            ImportedConversation(
                str(item.get("title") or ""),
                messages,
                _time(item.get("create_time")),
                _time(item.get("update_time")),
                "ChatGPT",
            )
        )
    return out


def _open_webui(data: list[Any]) -> list[ImportedConversation]:
    out = []
    for item in data:
        chat = item.get("chat") or {}
        history = chat.get("history") or {}
        nodes = history.get("messages") or {}
        current = history.get("currentId")
        raw: list[dict[str, Any]] = []
        if isinstance(nodes, dict) and current in nodes:
            seen: set[str] = set()
            while current in nodes and current not in seen:
                seen.add(str(current))
                raw.append(nodes[current])
                current = nodes[current].get("parentId")
            raw.reverse()
        else:
            raw = list(chat.get("messages") or [])
        messages = [
            ImportedMessage(role, _text_of(m.get("content")), _time(m.get("timestamp")))
            for m in raw
            if (role := _role(m.get("role"))) is not None
        ]
        out.append(
            ImportedConversation(
                str(item.get("title") or chat.get("title") or ""),
                messages,
                _time(item.get("created_at")),
                _time(item.get("updated_at")),
                "Open WebUI",
            )
        )
    return out


def _lm_studio(item: dict[str, Any]) -> ImportedConversation:
    messages = []
    for message in item.get("messages") or []:
        versions = message.get("versions") or []
        if not versions:
            continue
        selected = message.get("currentlySelected", 0)
        version = versions[
            selected if isinstance(selected, int) and 0 <= selected < len(versions) else 0
        ]
        role = _role(version.get("role"))
        if role is None:
            continue
        if version.get("type") == "multiStep":
            text = "\n".join(
                _text_of(step.get("content"))
                for step in version.get("steps") or []
                if step.get("type") == "contentBlock"
            )
        else:
            text = _text_of(version.get("content"))
        messages.append(ImportedMessage(role, text))
    return ImportedConversation(
        str(item.get("name") or ""),
        messages,
        _time(item.get("createdAt")),
        _time(item.get("updatedAt") or item.get("createdAt")),
        "LM Studio",
    )


def _galahad(item: dict[str, Any]) -> ImportedConversation:
    messages = []
    for m in item.get("messages") or []:
        role = _role(m.get("role"))
        if role is None:
            continue
        messages.append(ImportedMessage(role, str(m.get("text", "")), _time(m.get("created_at"))))
    return ImportedConversation(
        str(item.get("title") or ""),
        messages,
        _time(item.get("created_at")),
        _time(item.get("updated_at")),
        "Galahad",
    )


def _jan_thread(thread: dict[str, Any], lines: list[str]) -> ImportedConversation:
    messages = []
    for line in lines:
        if not line.strip():
            continue
        try:
            m = json.loads(line)
        except ValueError:
            raise InputError("A Jan messages.jsonl line is not JSON.") from None
        role = _role(m.get("role"))
        if role is not None:
            messages.append(
                ImportedMessage(
                    role, _text_of(m.get("content")), _time(m.get("created_at") or m.get("created"))
                )
            )
    return ImportedConversation(
        str(thread.get("title") or ""),
        messages,
        _time(thread.get("created") or thread.get("created_at")),
        _time(thread.get("updated") or thread.get("updated_at")),
        "Jan",
    )


_MD_SPEAKER = re.compile(
    r"^(?:#{1,6}\s*|\*\*)(You|User|Human|Me|Assistant|Gemma|Model|AI|ChatGPT|Bot)\b[^\n]*$",
    re.IGNORECASE | re.MULTILINE,
)


def _markdown(text: str) -> ImportedConversation:
    found = list(_MD_SPEAKER.finditer(text))
    if len(found) < 2:
        raise InputError(
            "This Markdown file is not a transcript: it needs speaker headings such as "
            "'## User' and '## Assistant' (or '**User:**')."
        )
    title_match = re.match(r"^#\s+(.+)$", text.strip().splitlines()[0])
    title = title_match.group(1).strip() if title_match and not _MD_SPEAKER.match(text) else ""
    messages = []
    for index, match in enumerate(found):
        end = found[index + 1].start() if index + 1 < len(found) else len(text)
        body = text[match.end() : end].strip()
        line = match.group(0)
        role = _role(match.group(1)) or "user"
        stamp = re.search(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2})?)", line)
        # "**User:** text" keeps its text on the speaker line
        inline = line.split(":**", 1)[1].strip() if line.startswith("**") and ":**" in line else ""
        messages.append(
            ImportedMessage(
                role,
                (inline + "\n\n" + body).strip() if inline else body,
                _time(stamp.group(1)) if stamp else None,
            )
        )
    return ImportedConversation(title, messages, None, None, "Markdown")


def _is_chatgpt(item: Any) -> bool:
    return isinstance(item, dict) and "mapping" in item and "current_node" in item


def _is_open_webui(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("chat"), dict)


def _is_lm_studio(item: Any) -> bool:
    messages = item.get("messages") if isinstance(item, dict) else None
    return isinstance(messages, list) and any(
        isinstance(m, dict) and "versions" in m for m in messages
    )


def parse_json(data: Any) -> list[ImportedConversation]:
    if isinstance(data, dict) and data.get("format") == GALAHAD_FORMAT:
        return [_galahad(data)]
    if isinstance(data, dict) and data.get("format") == f"{GALAHAD_FORMAT}s":
        return [_galahad(c) for c in data.get("conversations") or [] if isinstance(c, dict)]
    items = data if isinstance(data, list) else [data]
    if items and all(_is_chatgpt(i) for i in items):
        return _chatgpt(items)
    if items and all(_is_open_webui(i) for i in items):
        return _open_webui(items)
    if items and all(_is_lm_studio(i) for i in items):
        return [_lm_studio(i) for i in items]
    if isinstance(data, dict) and "title" in data and ("created" in data or "object" in data):
        raise InputError(
            "This is a Jan thread.json; import its folder (threads/<id>/) so its "
            "messages.jsonl is read too."
        )
    raise InputError(
        "The file's format was not recognised: expected a ChatGPT conversations.json, a Jan "
        "thread folder, an LM Studio .conversation.json, an Open WebUI export, a Markdown "
        "transcript or a Galahad export."
    )


def _read(path: Path) -> str:
    data = read_regular_file(path, MAX_IMPORT_BYTES, "an import")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"'{path.name}' is not UTF-8 text.") from None


def _jan_folder(folder: Path) -> list[ImportedConversation]:
    threads = (
        [folder]
        if (folder / "thread.json").exists()
        else sorted(
            p
            for p in (folder / "threads" if (folder / "threads").is_dir() else folder).iterdir()
            if (p / "thread.json").exists()
        )
    )
    out = []
    for thread_dir in threads:
        try:
            thread = json.loads(_read(thread_dir / "thread.json"))
        except ValueError:
            raise InputError(f"{thread_dir / 'thread.json'} is not JSON.") from None
        lines_path = thread_dir / "messages.jsonl"
        lines = _read(lines_path).splitlines() if lines_path.exists() else []
        out.append(_jan_thread(thread if isinstance(thread, dict) else {}, lines))
    return out


def read_file(path: Path) -> list[ImportedConversation]:
    """Every conversation in `path` (a file, or a Jan data or thread folder), normalized."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"'{path}' does not exist.")
    if path.is_dir():
        conversations = _jan_folder(path)
        if not conversations:
            raise InputError(f"'{path}' holds no Jan threads (thread.json + messages.jsonl).")
    else:
        text = _read(path)
        stripped = text.lstrip()
        if stripped.startswith(("{", "[")):
            try:
                data = json.loads(text)
            except (ValueError, RecursionError):
                raise InputError(f"'{path.name}' is not valid JSON.") from None
            if path.name == "thread.json" and (path.parent / "messages.jsonl").exists():
                conversations = _jan_folder(path.parent)
            else:
                conversations = parse_json(data)
        elif path.name.endswith(".jsonl") and (path.parent / "thread.json").exists():
            conversations = _jan_folder(path.parent)
        else:
            conversations = [_markdown(text)]
    total = sum(len(c.messages) for c in conversations)
    if total > MAX_MESSAGES:
        raise InputError(f"The file holds {total:,} messages; at most {MAX_MESSAGES:,} at a time.")
    return [normalize(c) for c in conversations]


# -- export --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportedMessage:
    role: str
    text: str
    created_at: float


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def to_json(title: str, created: float, updated: float, messages: list[ExportedMessage]) -> str:
    return json.dumps(
        {
            "format": GALAHAD_FORMAT,
            "version": 1,
            "title": title,
            "created_at": created,
            "updated_at": updated,
            "messages": [
                {"role": m.role, "text": m.text, "created_at": m.created_at} for m in messages
            ],
        },
        ensure_ascii=False,
        indent=1,
    )


_WHO = {"user": "You", "model": "Gemma", "document": "Document"}


def to_markdown(title: str, created: float, updated: float, messages: list[ExportedMessage]) -> str:
    lines = [
        f"# {title or 'Conversation'}",
        "",
        f"_Started {_stamp(created)}, last message {_stamp(updated)}._",
        "",
    ]
    for m in messages:
        lines += [f"## {_WHO.get(m.role, m.role)} — {_stamp(m.created_at)}", "", m.text, ""]
    return "\n".join(lines)


def to_html(title: str, created: float, updated: float, messages: list[ExportedMessage]) -> str:
    body = []
    for m in messages:
        body.append(
            f'<section class="{html.escape(m.role)}"><h2>{html.escape(_WHO.get(m.role, m.role))}'
            f" <small>{_stamp(m.created_at)}</small></h2><pre>{html.escape(m.text)}</pre>"
            "</section>"
        )
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>{html.escape(title or 'Conversation')}</title><style>"
        "body{font-family:sans-serif;max-width:50em;margin:auto}pre{white-space:pre-wrap;"
        "font-family:inherit}.user h2{color:#1a73e8}.model h2{color:#188038}</style></head>"
        f"<body><h1>{html.escape(title or 'Conversation')}</h1><p>Started {_stamp(created)}"
        f", last message {_stamp(updated)}.</p>{''.join(body)}</body></html>"
    )


EXPORTERS = {"json": to_json, "md": to_markdown, "html": to_html}
