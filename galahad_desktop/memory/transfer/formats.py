"""Chat history in other apps' formats, read (import); exporters.py writes them.

ChatGPT's data export (`conversations.json`, following each conversation's current
branch through its message tree), Jan threads (`threads/<id>/thread.json` with
`messages.jsonl`), LM Studio conversation files (`*.conversation.json`, the selected version
of each message), Open WebUI's JSON export (the current branch of its history tree), a
Markdown transcript, and Galahad's own JSON export. The format is detected from the content,
never from the file name alone. Everything here is pure: text in, conversations out.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from galahad_desktop.errors import MAX_TITLE_CHARS, InputError
from galahad_desktop.system.files import read_regular_file

MAX_IMPORT_BYTES = 512 * 1024 * 1024
MAX_MESSAGES = 100_000
GALAHAD_FORMAT = "galahad-conversation"

ImportedRole = Literal["user", "model"]


@dataclass
class ImportedMessage:
    role: ImportedRole
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


# The times an import may carry: after 1970 and before 2200 (anything else is a damaged or
# hostile value, and would make an export fail: ignored and said so).
_EARLIEST, _LATEST = 0.0, 7_258_118_400.0


def _time(value: Any) -> float | None:
    """Seconds since the epoch from a number (s or ms) or an ISO date; None if unreadable or
    impossible (nan, inf, negative, past 2200)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an integer too large for a float
            return None
        if not math.isfinite(seconds):
            return None
        seconds = seconds / 1000 if seconds > 1e11 else seconds
        return seconds if _EARLIEST <= seconds <= _LATEST else None
    if isinstance(value, str):
        text = value.strip()[:64]
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
        try:
            seconds = parsed.timestamp()
        except (OverflowError, OSError, ValueError):
            return None
        return seconds if _EARLIEST <= seconds <= _LATEST else None
    return None


class Obj:
    """A JSON object from an import file, read field by field: a field of the wrong type is
    refused with where it is ("conversations.json: conversation 3 ('Rivers'), node a4:
    'content' should be an object"); a missing or null one reads as absent."""

    def __init__(self, value: Any, where: str, what: str = "") -> None:
        if not isinstance(value, dict):
            raise InputError(f"{where}: {what or 'this'} should be an object.")
        self.value: dict[str, Any] = value
        self.where = where

    def _wrong(self, key: str, kind: str) -> InputError:
        return InputError(f"{self.where}: '{key}' should be {kind}.")

    def has(self, key: str) -> bool:
        return self.value.get(key) is not None

    def obj(self, key: str) -> Obj | None:
        value = self.value.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self._wrong(key, "an object")
        return Obj(value, self.where)

    def objects(self, key: str) -> dict[str, Any]:
        """A mapping (id -> object): the objects themselves are read by the caller."""
        value = self.value.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._wrong(key, "an object")
        return value

    def items(self, key: str) -> list[Any]:
        value = self.value.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._wrong(key, "a list")
        return value

    def text(self, key: str) -> str:
        value = self.value.get(key)
        if value is None:
            return ""
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self._wrong(key, "text")
        return str(value)

    def ident(self, key: str) -> str | None:
        """An id (text or a number), or None."""
        value = self.value.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise self._wrong(key, "an id (text)")
        return str(value)

    def index(self, key: str) -> int | None:
        value = self.value.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def time(self, *keys: str) -> float | None:
        """The first of `keys` that holds a readable, possible time."""
        for key in keys:
            found = _time(self.value.get(key))
            if found is not None:
                return found
        return None

    def content(self, key: str) -> str:
        return _text_of(self.value.get(key))


_ROLES: dict[str, ImportedRole] = {
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


def _role(value: Any) -> ImportedRole | None:
    return _ROLES.get(str(value or "").strip().lower())


def _text_of(content: Any, depth: int = 0) -> str:
    """Text from the content shapes the formats use: a string, a list of strings or parts
    ({"type": "text", "text": ...}, {"text": {"value": ...}}), or {"parts": [...]}. Anything
    else (numbers, images, shapes nested deeper than any app writes) holds no text."""
    if content is None or depth > 8:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (_text_of(item, depth + 1) for item in content) if t)
    if isinstance(content, dict):
        if "parts" in content:
            return _text_of(content["parts"], depth + 1)
        kind = content.get("type")
        if kind not in (None, "text", "input_text", "output_text"):
            return ""
        text = content.get("text")
        if isinstance(text, dict):
            value = text.get("value")
            return value if isinstance(value, str) else ""
        if isinstance(text, str):
            return text
        if "content" in content:
            return _text_of(content["content"], depth + 1)
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
        dropped.append("broken characters (unpaired surrogates) replaced by U+FFFD")
        text = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    return text.strip()


# Bidirectional overrides and isolates: in a title they can make a list show another name.
_BIDI = dict.fromkeys(
    map(ord, "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
)


def _clean_title(title: str, dropped: list[str]) -> str:
    """A title as one line of plain text: control and bidirectional-override characters
    removed, broken characters replaced, at most MAX_TITLE_CHARS; each change said."""
    text = _clean(title, dropped)
    plain = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    plain = " ".join(plain.translate(_BIDI).split())
    if plain != " ".join(text.split()):
        dropped.append("control or text-direction characters removed from the title")
    if len(plain) > MAX_TITLE_CHARS:
        dropped.append(f"the title shortened to {MAX_TITLE_CHARS} characters")
        plain = plain[: MAX_TITLE_CHARS - 1] + "…"
    return plain


def normalize(conversation: ImportedConversation) -> ImportedConversation:
    """User and model turns alternating, starting with the user: consecutive messages of
    one role are joined; what cannot be placed is listed in `dropped`."""
    conversation.title = _clean_title(conversation.title, conversation.dropped)
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


def _label(name: str, number: int, title: Any) -> str:
    """'conversations.json: conversation 3 ('Rivers')' for error messages."""
    shown = f" ('{_short(title)}')" if isinstance(title, str) and title.strip() else ""
    return f"{name}: conversation {number}{shown}"


def _short(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _chatgpt(data: list[Any], name: str) -> list[ImportedConversation]:
    out = []
    for number, raw in enumerate(data, start=1):
        where = _label(name, number, raw.get("title") if isinstance(raw, dict) else None)
        item = Obj(raw, where, "the conversation")
        mapping = item.objects("mapping")
        node_id = item.ident("current_node")
        chain: list[Obj] = []
        seen: set[str] = set()
        while node_id is not None and node_id in mapping and node_id not in seen:
            seen.add(node_id)
            node = Obj(mapping[node_id] or {}, f"{where}, node {_short(node_id)}", "the node")
            message = node.obj("message")
            if message is not None:
                chain.append(message)
            node_id = node.ident("parent")
        messages = []
        for message in reversed(chain):
            author = message.obj("author")
            role = _role(author.text("role") if author else "")
            metadata = message.obj("metadata")
            if role is None or (
                metadata and metadata.value.get("is_visually_hidden_from_conversation")
            ):
                continue
            content = message.obj("content")
            if content is None:
                continue
            if content.text("content_type") not in ("", "text", "multimodal_text"):
                continue
            messages.append(
                ImportedMessage(role, _text_of(content.value), message.time("create_time"))
            )
        out.append(
            ImportedConversation(
                item.text("title"),
                messages,
                item.time("create_time"),
                item.time("update_time"),
                "ChatGPT",
            )
        )
    return out


def _open_webui(data: list[Any], name: str) -> list[ImportedConversation]:
    out = []
    for number, raw in enumerate(data, start=1):
        where = _label(name, number, raw.get("title") if isinstance(raw, dict) else None)
        item = Obj(raw, where, "the conversation")
        chat = item.obj("chat") or Obj({}, where)
        history = chat.obj("history") or Obj({}, where)
        nodes = history.objects("messages")
        current = history.ident("currentId")
        raw_messages: list[Obj] = []
        if nodes and current is not None and current in nodes:
            seen: set[str] = set()
            while current is not None and current in nodes and current not in seen:
                seen.add(current)
                node = Obj(nodes[current], f"{where}, message {_short(current)}", "the message")
                raw_messages.append(node)
                current = node.ident("parentId")
            raw_messages.reverse()
        else:
            raw_messages = [
                Obj(m, f"{where}, message {i}", "the message")
                for i, m in enumerate(chat.items("messages"), start=1)
            ]
        messages = [
            ImportedMessage(role, m.content("content"), m.time("timestamp"))
            for m in raw_messages
            if (role := _role(m.text("role"))) is not None
        ]
        out.append(
            ImportedConversation(
                item.text("title") or chat.text("title"),
                messages,
                item.time("created_at"),
                item.time("updated_at"),
                "Open WebUI",
            )
        )
    return out


def _lm_studio(raw: Any, where: str) -> ImportedConversation:
    item = Obj(raw, where, "the conversation")
    messages = []
    for number, raw_message in enumerate(item.items("messages"), start=1):
        message = Obj(raw_message, f"{where}, message {number}", "the message")
        versions = message.items("versions")
        if not versions:
            continue
        selected = message.index("currentlySelected") or 0
        version = Obj(
            versions[selected if 0 <= selected < len(versions) else 0],
            f"{where}, message {number}",
            "the selected version",
        )
        role = _role(version.text("role"))
        if role is None:
            continue
        if version.text("type") == "multiStep":
            steps = [
                Obj(step, f"{where}, message {number}", "a step") for step in version.items("steps")
            ]
            text = "\n".join(
                step.content("content") for step in steps if step.text("type") == "contentBlock"
            )
        else:
            text = version.content("content")
        messages.append(ImportedMessage(role, text))
    return ImportedConversation(
        item.text("name"),
        messages,
        item.time("createdAt"),
        item.time("updatedAt", "createdAt"),
        "LM Studio",
    )


def _galahad(raw: Any, where: str) -> ImportedConversation:
    item = Obj(raw, where, "the conversation")
    messages = []
    for number, raw_message in enumerate(item.items("messages"), start=1):
        m = Obj(raw_message, f"{where}, message {number}", "the message")
        role = _role(m.text("role"))
        if role is None:
            continue
        messages.append(ImportedMessage(role, m.text("text"), m.time("created_at")))
    return ImportedConversation(
        item.text("title"),
        messages,
        item.time("created_at"),
        item.time("updated_at"),
        "Galahad",
    )


def _jan_thread(raw: Any, lines: list[str], where: str) -> ImportedConversation:
    thread = Obj(raw, where, "thread.json")
    messages = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            decoded = json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(f"{where}: line {number} of messages.jsonl is not JSON.") from None
        m = Obj(decoded, f"{where}, messages.jsonl line {number}", "the message")
        role = _role(m.text("role"))
        if role is not None:
            messages.append(
                ImportedMessage(role, m.content("content"), m.time("created_at", "created"))
            )
    return ImportedConversation(
        thread.text("title"),
        messages,
        thread.time("created", "created_at"),
        thread.time("updated", "updated_at"),
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
        said = (inline + "\n\n" + body).strip() if inline else body
        messages.append(
            ImportedMessage(
                role, _unescape_headings(said), _time(stamp.group(1)) if stamp else None
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


GALAHAD_EXPORT_VERSION = 1  # the newest Galahad export this version reads


def _check_galahad_version(data: dict[str, Any], name: str) -> None:
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        shown = repr(version)[:40]
        raise InputError(
            f"{name}: 'version' should be a whole number from 1 (a Galahad export), got {shown}."
        )
    if version > GALAHAD_EXPORT_VERSION:
        raise InputError(
            f"{name} is a Galahad export of version {version}; this Galahad reads at most "
            f"version {GALAHAD_EXPORT_VERSION}. Update Galahad to import it."
        )


def parse_json(data: Any, name: str = "the file") -> list[ImportedConversation]:
    if isinstance(data, dict) and data.get("format") in (GALAHAD_FORMAT, f"{GALAHAD_FORMAT}s"):
        _check_galahad_version(data, name)
    if isinstance(data, dict) and data.get("format") == GALAHAD_FORMAT:
        return [_galahad(data, name)]
    if isinstance(data, dict) and data.get("format") == f"{GALAHAD_FORMAT}s":
        items = Obj(data, name).items("conversations")
        return [_galahad(c, _label(name, n, None)) for n, c in enumerate(items, start=1)]
    items = data if isinstance(data, list) else [data]
    if items and all(_is_chatgpt(i) for i in items):
        return _chatgpt(items, name)
    if items and all(_is_open_webui(i) for i in items):
        return _open_webui(items, name)
    if items and all(_is_lm_studio(i) for i in items):
        return [_lm_studio(i, _label(name, n, None)) for n, i in enumerate(items, start=1)]
    if isinstance(data, dict) and "title" in data and ("created" in data or "object" in data):
        raise InputError(
            "This is a Jan thread.json; import its folder (threads/<id>/) so its "
            "messages.jsonl is read too."
        )
    raise InputError(
        f"{name}: the format was not recognised: expected a ChatGPT conversations.json, a Jan "
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
        except (ValueError, RecursionError):
            raise InputError(f"{thread_dir / 'thread.json'} is not JSON.") from None
        lines_path = thread_dir / "messages.jsonl"
        lines = _read(lines_path).splitlines() if lines_path.exists() else []
        out.append(_jan_thread(thread, lines, f"Jan thread {thread_dir.name}"))
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
                conversations = parse_json(data, path.name)
        elif path.name.endswith(".jsonl") and (path.parent / "thread.json").exists():
            conversations = _jan_folder(path.parent)
        else:
            conversations = [_markdown(text)]
    total = sum(len(c.messages) for c in conversations)
    if total > MAX_MESSAGES:
        raise InputError(f"The file holds {total:,} messages; at most {MAX_MESSAGES:,} at a time.")
    return [normalize(c) for c in conversations]


# A message line that would read as a speaker heading ("## You", "**User:**") is written with
# one more leading backslash (exporters.py), and read back with one less: a message cannot
# forge a turn.
_ESCAPED = re.compile(r"^\\(\\*)(#|\*\*)", re.MULTILINE)


def _unescape_headings(text: str) -> str:
    return _ESCAPED.sub(lambda m: m.group(1) + m.group(2), text)
