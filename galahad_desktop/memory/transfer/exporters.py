"""Exporters: a conversation written as a Galahad JSON export (which imports back exactly),
Markdown or HTML. The importers are formats.py."""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from galahad_desktop.memory.transfer.formats import GALAHAD_FORMAT


@dataclass(frozen=True)
class ExportedMessage:
    role: str
    text: str
    created_at: float


def shown_text(role: str, text: str, calls: Sequence[Any]) -> str:
    """A message as an export shows it: the tools a reply called, and what they returned,
    in words (they are kept as JSON; an import reads them back as a plain chat)."""
    if role == "tool":
        try:
            return "\n".join(f"↳ {r['name']} returned: {r['content']}" for r in json.loads(text))
        except (ValueError, KeyError, TypeError):
            return text
    made = ", ".join(f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in calls)
    return f"{text}\n\nCalled {made}".strip() if made else text


def _stamp(seconds: float) -> str:
    """A stored time for people; any value a damaged or old record holds is shown, not fatal."""
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))
    except (OverflowError, OSError, ValueError, TypeError):
        return "an unknown time"


# A message line that would read as a speaker heading ("## You", "**User:**") is written with
# one more leading backslash, and read back with one less (formats.py): a message cannot forge
# a turn.
_HEADING_LIKE = re.compile(r"^(\\*)(#|\*\*)", re.MULTILINE)


def _escape_headings(text: str) -> str:
    return _HEADING_LIKE.sub(lambda m: "\\" + m.group(0), text)


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


_WHO = {"user": "You", "model": "Gemma", "document": "Document", "tool": "Tool"}


def to_markdown(title: str, created: float, updated: float, messages: list[ExportedMessage]) -> str:
    lines = [
        f"# {title or 'Conversation'}",
        "",
        f"_Started {_stamp(created)}, last message {_stamp(updated)}._",
        "",
    ]
    for m in messages:
        who = _WHO.get(m.role, m.role)
        lines += [f"## {who} — {_stamp(m.created_at)}", "", _escape_headings(m.text), ""]
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
