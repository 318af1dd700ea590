"""Markdown to the HTML subset QTextBrowser shows, with code highlighted by Pygments."""

from __future__ import annotations

import html

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound


def _highlight(code: str, lang: str, _attrs: str) -> str:
    try:
        lexer = get_lexer_by_name(lang) if lang else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style="default")
    body = highlight(code, lexer, formatter)
    return (
        f'<pre style="background:#f6f8fa;color:#24292e;padding:6px;'
        f'font-family:monospace">{body}</pre>'
    )


# "html": False: text the model or a user writes is never interpreted as HTML.
_MD = MarkdownIt("commonmark", {"html": False, "highlight": _highlight}).enable("table")


def markdown_html(text: str) -> str:
    return str(_MD.render(text))


def message_html(role: str, text: str, dark: bool) -> str:
    if role == "document":  # a document put into the conversation: its name, not its text
        return (
            '<div style="margin:6px 0"><b style="color:gray">Document</b>'
            f"<p>📄 {html.escape(text)}</p></div>"
        )
    who = {"user": "You", "model": "Gemma"}.get(role, role)
    accent = (
        ("#8ab4f8" if dark else "#1a73e8") if role == "user" else ("#81c995" if dark else "#188038")
    )
    body = markdown_html(text) if text else "<p><i>…</i></p>"
    return f'<div style="margin:6px 0"><b style="color:{accent}">{html.escape(who)}</b>{body}</div>'
