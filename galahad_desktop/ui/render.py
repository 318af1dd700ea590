"""Markdown to the HTML subset QTextBrowser shows, each turn as a card, code highlighted by
Pygments.

A turn is a one-cell table (Qt's rich text draws a table cell's background and padding, not
a div's): the speaker, an optional time and the turn's actions ("Copy", "Regenerate",
"Edit", "Branch", as `galahad:` links the window handles) above the body. Headings in a
reply are scaled down to the turn's size, so a model's `# Title` stays inside its card. Each
code block carries its language and a "Copy" link. Text the model or a user writes is never
interpreted as HTML.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Sequence
from typing import Any

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from galahad_desktop.ui import theme
from galahad_desktop.ui.theme import Palette

_HEADING = re.compile(r"<(/?)h([1-6])>")
# A heading inside a turn: a step above the body at most, never a page title.
_HEADING_STYLE = {
    "1": "font-size:large;font-weight:600",
    "2": "font-size:medium;font-weight:600",
}


def _pygments_style(palette: Palette) -> str:
    return "monokai" if palette.name == "dark" else "default"


def _code_html(code: str, lang: str, index: int, block: int, palette: Palette) -> str:
    try:
        lexer = get_lexer_by_name(lang) if lang else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style=_pygments_style(palette))
    body = highlight(code, lexer, formatter)
    label = html.escape(lang or "text")
    p = palette
    return (
        f'<table width="100%" cellspacing="0" cellpadding="8" bgcolor="{p.code_bg}" '
        f'style="margin:6px 0;border:1px solid {p.border}">'
        f'<tr><td><span style="color:{p.muted};font-size:small">{label}</span>'
        f'&nbsp;&nbsp;<a href="galahad:copy-code/{index}/{block}" '
        f'style="font-size:small;color:{p.accent};text-decoration:none">Copy</a>'
        f'<pre style="color:{p.code_text};font-family:monospace;margin:4px 0 0 0">{body}</pre>'
        "</td></tr></table>"
    )


def _fence(_self: Any, tokens: Any, idx: int, _options: Any, env: dict[str, Any]) -> str:
    token = tokens[idx]
    lang = token.info.strip().split()[0] if token.info.strip() else ""
    block = env.setdefault("block", 0)
    env["block"] = block + 1
    return _code_html(token.content, lang, env.get("index", 0), block, env["palette"])


# "html": False: text the model or a user writes is never interpreted as HTML.
# "breaks": a line break typed in a message (Shift+Enter) or written by the model is one
# on screen too, as in every chat app (CommonMark alone joins the lines of a paragraph).
_MD = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable("table")
_MD.add_render_rule("fence", _fence)
_MD.add_render_rule("code_block", _fence)


def plain_text(markdown: str) -> str:
    """Markdown as the words a reader sees, on one line (a sidebar preview showed
    "- - 1. Project Falcon…"): marks, list bullets and fences dropped, code kept."""
    words: list[str] = []
    for token in _MD.parse(markdown):
        if token.type == "inline":
            words += [c.content for c in token.children or [] if c.type in ("text", "code_inline")]
        elif token.type in ("fence", "code_block"):
            words.append(token.content)
    return " ".join(" ".join(words).split())


_CELL = re.compile(r'<(th|td)(?: style="([^"]*)")?>')


def _styled(body: str, p: Palette) -> str:
    """Markdown's tables and quotes drawn from the theme: a table with cell borders and a
    shaded header, a quote with a bar on its left (Qt's rich text draws neither itself)."""
    body = body.replace(
        "<table>",
        f'<table cellspacing="0" cellpadding="5" border="1" '
        f'style="border-color:{p.border};border-style:solid;margin:6px 0">',
    )
    body = _CELL.sub(
        lambda m: (
            f'<{m.group(1)} style="border:1px solid {p.border};{m.group(2) or ""}"'
            + (f' bgcolor="{p.surface}">' if m.group(1) == "th" else ">")
        ),
        body,
    )
    body = body.replace(
        "<blockquote>",
        f'<table cellspacing="0" cellpadding="0" style="margin:6px 0"><tr>'
        f'<td width="4" bgcolor="{p.accent}"></td><td width="10"></td>'
        f'<td style="color:{p.muted}">',
    )
    return body.replace("</blockquote>", "</td></tr></table>")


def markdown_html(text: str, palette: Palette | None = None, index: int = 0) -> str:
    palette = palette or theme.current()
    body = str(_MD.render(text, {"palette": palette, "index": index}))
    return _styled(_HEADING.sub(_heading, body), palette)


def _heading(match: re.Match[str]) -> str:
    closing, level = match.group(1), match.group(2)
    if closing:
        return "</p>"
    return f'<p style="{_HEADING_STYLE.get(level, "font-weight:600")};margin:8px 0 4px 0">'


def code_blocks(text: str) -> list[str]:
    """The fenced and indented code blocks of a message, in order (what "Copy" copies)."""
    return [t.content for t in _MD.parse(text) if t.type in ("fence", "code_block")]


def _actions(index: int, actions: Sequence[str], palette: Palette) -> str:
    links = [
        f'<a href="galahad:{action}/{index}" style="color:{palette.muted};'
        f'text-decoration:none">{action.replace("-", " ").capitalize()}</a>'
        for action in actions
    ]
    return "&nbsp;&nbsp;·&nbsp;&nbsp;".join(links)


def _thinking_html(
    thoughts: str, expanded: bool, p: Palette, index: int, label: str = "Thinking…"
) -> str:
    """A reply's thoughts (or a tool's result): a link that folds them, and the thoughts
    when unfolded."""
    arrow = "▾" if expanded else "▸"
    words = len(thoughts.split())
    thinking = (
        f'<p style="margin:4px 0"><a href="galahad:toggle-thoughts/{index}" '
        f'style="color:{p.muted};text-decoration:none">{arrow} {label} '
        f"({words} word{'' if words == 1 else 's'})</a></p>"
    )
    if expanded:  # thoughts in italics (not the answer); a tool's result as it came
        style = f"color:{p.muted};font-style:italic" if label == "Thinking…" else ""
        thinking += (
            f'<table width="100%" cellpadding="8" bgcolor="{p.surface}"><tr><td '
            f'style="{style}">{markdown_html(thoughts, p, index)}</td></tr></table>'
        )
    return thinking


def _card_head(
    role: str,
    model_name: str,
    when: float,
    version: tuple[int, int],
    actions: Sequence[str],
    note: str,
    index: int,
    p: Palette,
) -> str:
    """A turn card's header: who wrote it, when, its versions' pager, its actions, how it
    ended."""
    who = {"user": "You", "model": model_name}.get(role, role)
    head = f'<b style="color:{p.text}">{html.escape(who)}</b>'
    if when:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(when))
        head += f'&nbsp;&nbsp;<span style="color:{p.muted};font-size:small">{stamp}</span>'
    number, count = version
    if count > 1:
        link = f'style="color:{p.muted};text-decoration:none"'
        head += (
            f'&nbsp;&nbsp;<span style="font-size:small">'
            f'<a href="galahad:version-previous/{index}" {link} title="Previous version">‹</a>'
            f"&nbsp;{number}/{count}&nbsp;"
            f'<a href="galahad:version-next/{index}" {link} title="Next version">›</a></span>'
        )
    if actions:
        head += (
            f'&nbsp;&nbsp;&nbsp;<span style="font-size:small">{_actions(index, actions, p)}</span>'
        )
    if note:
        head += (
            f'&nbsp;&nbsp;<span style="color:{p.muted};font-size:small">{html.escape(note)}</span>'
        )
    return head


def message_html(
    role: str,
    text: str,
    palette: Palette | None = None,
    index: int = 0,
    thoughts: str = "",
    expanded: bool = False,
    model_name: str = "Gemma",
    actions: Sequence[str] = (),
    when: float = 0.0,
    picture: tuple[str, int, int] | None = None,
    version: tuple[int, int] = (1, 1),
    note: str = "",
    memo: tuple[float, bool] | None = None,
) -> str:
    """One turn as a card; `actions` name the links shown in its header; `when` (a Unix
    time, 0 for none) adds the time it was written; `picture` (a resource key, width,
    height) shows a picture put into the conversation; `version` (which, of how many) pages
    a regenerated reply's versions ("‹ 2/3 ›"); `note` says how a reply ended, when that
    is not simply its end ("stopped", "the length limit"); `memo` (its seconds, whether it
    plays now) shows a voice memo put into the conversation, with Play or Stop."""
    p = palette or theme.current()
    anchor = f'<a name="m{index}"></a>'
    if role == "document" and memo is not None:
        seconds, playing = memo
        whole = round(seconds)
        action, label = ("stop", "■ Stop") if playing else ("play", "▶ Play")
        return (
            f'<table cellspacing="0" cellpadding="10" bgcolor="{p.surface}" '
            f'style="margin:4px 0 10px 0;border:1px solid {p.border}"><tr><td>{anchor}'
            f'<span style="color:{p.muted};font-size:small">Voice memo added</span><br>'
            f"<b>{html.escape(text)}</b>&nbsp;&nbsp;"
            f'<span style="color:{p.muted}">{whole // 60}:{whole % 60:02d}</span>&nbsp;&nbsp;'
            f'<a href="galahad:{action}/{index}" style="color:{p.accent};text-decoration:none" '
            f'title="{label[2:]} the memo (from memory)">{label}</a></td></tr></table>'
        )
    if role == "document" and picture is not None:
        key, width, height = picture
        return (
            f'<table cellspacing="0" cellpadding="10" bgcolor="{p.surface}" '
            f'style="margin:4px 0 10px 0;border:1px solid {p.border}"><tr><td>{anchor}'
            f'<span style="color:{p.muted};font-size:small">Picture added · '
            f"{html.escape(text)}</span><br>"
            f'<img src="galahad-picture:{key}" width="{width}" height="{height}" '
            f'alt="{html.escape(text, quote=True)}"></td></tr></table>'
        )
    if role == "document":  # a document put into the conversation: its name, not its text
        return (
            f'<table width="100%" cellspacing="0" cellpadding="10" bgcolor="{p.surface}" '
            f'style="margin:4px 0 10px 0;border:1px solid {p.border}"><tr><td>{anchor}'
            f'<span style="color:{p.muted};font-size:small">Document added</span><br>'
            f"<b>{html.escape(text)}</b></td></tr></table>"
        )
    if role == "note":  # the app's own words (a document's acknowledgement): not the model's
        return (
            f'<p style="color:{p.muted};font-size:small;margin:0 0 10px 12px">{anchor}'
            f"{html.escape(text)}</p>"
        )
    if role == "tool":  # a tool the window ran: the call, how it went, its result folded
        state = f" · {html.escape(note)}" if note else ""
        result = _thinking_html(thoughts, expanded, p, index, "Result") if thoughts else ""
        return (
            f'<table width="100%" cellspacing="0" cellpadding="10" bgcolor="{p.surface}" '
            f'style="margin:4px 0 10px 24px;border:1px solid {p.border}"><tr><td>{anchor}'
            f'<span style="color:{p.muted};font-size:small">Tool{state}</span><br>'
            f'<span style="font-family:monospace">{html.escape(text)}</span>{result}'
            "</td></tr></table>"
        )
    card = p.user_card if role == "user" else p.model_card
    head = _card_head(role, model_name, when, version, actions, note, index, p)
    thinking = _thinking_html(thoughts, expanded, p, index) if thoughts else ""
    body = markdown_html(text, p, index) if text else f'<p style="color:{p.muted}">…</p>'
    return (
        f'<table width="100%" cellspacing="0" cellpadding="12" bgcolor="{card}" '
        f'style="margin:4px 0 10px 0;border:1px solid {p.border}"><tr><td>'
        f"{anchor}{head}{thinking}{body}</td></tr></table>"
    )
