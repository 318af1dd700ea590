"""Markdown to the HTML subset QTextBrowser shows, with code highlighted by Pygments.

Each message carries its own links: "Copy" for a reply, "Copy code" for each code block, and
a collapsed "Thinking…" section that opens on a click. The links are `galahad:` URLs the
window handles; text the model or a user writes is never interpreted as HTML.
"""

from __future__ import annotations

import html

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound


def _style(dark: bool) -> str:
    return "monokai" if dark else "default"


def _highlighter(dark: bool):  # type: ignore[no-untyped-def]
    def render(code: str, lang: str, _attrs: str) -> str:
        try:
            lexer = get_lexer_by_name(lang) if lang else TextLexer()
        except ClassNotFound:
            lexer = TextLexer()
        formatter = HtmlFormatter(noclasses=True, nowrap=True, style=_style(dark))
        body = highlight(code, lexer, formatter)
        background, color = ("#272822", "#f8f8f2") if dark else ("#f6f8fa", "#24292e")
        return (
            f'<pre style="background:{background};color:{color};padding:6px;'
            f'font-family:monospace">{body}</pre>'
        )

    return render


# "html": False: text the model or a user writes is never interpreted as HTML.
_MD = {
    dark: MarkdownIt("commonmark", {"html": False, "highlight": _highlighter(dark)}).enable("table")
    for dark in (False, True)
}


def markdown_html(text: str, dark: bool = False) -> str:
    return str(_MD[dark].render(text))


def code_blocks(text: str) -> list[str]:
    """The fenced and indented code blocks of a message, in order (what "Copy code" copies)."""
    return [t.content for t in _MD[False].parse(text) if t.type in ("fence", "code_block")]


def _with_copy_links(body: str, index: int) -> str:
    """A "Copy code" link after each code block of message `index`."""
    out, block, at = [], 0, 0
    while True:
        found = body.find("</pre>", at)
        if found < 0:
            out.append(body[at:])
            return "".join(out)
        end = found + len("</pre>")
        out.append(body[at:end])
        out.append(
            f'<p style="margin:0"><a href="galahad:copy-code/{index}/{block}">Copy code</a></p>'
        )
        block += 1
        at = end


def message_html(
    role: str,
    text: str,
    dark: bool,
    index: int = 0,
    thoughts: str = "",
    expanded: bool = False,
    model_name: str = "Gemma",
) -> str:
    anchor = f'<a name="m{index}"></a>'
    if role == "document":  # a document put into the conversation: its name, not its text
        return (
            f'<div style="margin:6px 0">{anchor}<b style="color:gray">Document</b>'
            f"<p>📄 {html.escape(text)}</p></div>"
        )
    who = {"user": "You", "model": model_name}.get(role, role)
    accent = (
        ("#8ab4f8" if dark else "#1a73e8") if role == "user" else ("#81c995" if dark else "#188038")
    )
    thinking = ""
    if thoughts:
        arrow = "▾" if expanded else "▸"
        thinking = (
            f'<p style="margin:2px 0"><a href="galahad:toggle-thoughts/{index}">{arrow} '
            f"Thinking… ({len(thoughts.split())} words)</a></p>"
        )
        if expanded:
            thinking += (
                f'<blockquote style="color:gray">{markdown_html(thoughts, dark)}</blockquote>'
            )
    body = _with_copy_links(markdown_html(text, dark), index) if text else "<p><i>…</i></p>"
    copy = (
        f' <small><a href="galahad:copy/{index}">Copy</a></small>'
        if role == "model" and text
        else ""
    )
    return (
        f'<div style="margin:6px 0">{anchor}<b style="color:{accent}">{html.escape(who)}</b>'
        f"{copy}{thinking}{body}</div>"
    )
