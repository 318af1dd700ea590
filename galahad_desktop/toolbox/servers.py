"""An MCP server as the user added it: a name, and a command line (stdio) or a URL
(streamable HTTP). Checked once, here, whichever front end adds it."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from galahad_desktop.errors import InputError

DEFAULT_TIMEOUT_S = 60.0  # a call that takes longer is stopped and the model is told
MAX_TIMEOUT_S = 3600.0
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class ToolServer:
    name: str
    command: tuple[str, ...] = ()  # a program and its arguments, run with stdio
    url: str = ""  # a streamable HTTP endpoint
    timeout_s: float = DEFAULT_TIMEOUT_S
    headers: tuple[tuple[str, str], ...] = ()  # sent to a URL server (an API token, often)

    @property
    def target(self) -> str:
        """The command line or URL as the user typed it, with what may be a secret masked
        (for the Tools page and `tools list`): a URL's password or user part and its query
        values, a command's environment values and secret-named options; headers are
        counted, never shown."""
        if not self.url:
            return " ".join(
                w if MASK in w else shlex.quote(w) for w in masked_command(self.command)
            )
        count = len(self.headers)
        shown = masked_url(self.url)
        return shown + (f" (+{count} header{'s' if count > 1 else ''})" if count else "")

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": list(self.command),
            "url": self.url,
            "timeout_s": self.timeout_s,
            "headers": [list(h) for h in self.headers],
        }


MASK = "•••"
_SECRET_OPTION = re.compile(r"^(--?[\w-]*(token|key|secret|passw|auth|cred)[\w-]*)=", re.I)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def masked_url(url: str) -> str:
    """The URL with its user part's password (or a lone user part, often a token) and its
    query's values replaced by a mask."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name, colon, _password = user.partition(":")
        netloc = f"{name}:{MASK}@{host}" if colon else f"{MASK}@{host}"
    query = "&".join(
        f"{key}={MASK}" if sep else key
        for key, sep, _value in (item.partition("=") for item in parts.query.split("&") if item)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def masked_command(command: Sequence[str]) -> list[str]:
    """The command's words with environment values (`env KEY=value …`, before the program)
    and secret-named options' values (`--api-key=…`, `--token …`) masked."""
    shown: list[str] = []
    program_seen = False
    hide_next = False
    for word in command:
        if hide_next:
            shown.append(MASK)
            hide_next = False
            continue
        if not program_seen and _ASSIGNMENT.match(word):
            shown.append(word.split("=", 1)[0] + "=" + MASK)
            continue
        if os.path.basename(word) != "env":
            program_seen = program_seen or not word.startswith("-")
        option = _SECRET_OPTION.match(word)
        if option:
            shown.append(option.group(1) + "=" + MASK)
        elif word.startswith("-") and _SECRET_OPTION.match(word + "="):
            shown.append(word)
            hide_next = True
        else:
            shown.append(word)
    return shown


def check_server_name(name: str) -> str:
    name = name.strip()
    if not _NAME.match(name):
        raise InputError(
            f"A tool server's name must be 1-32 letters, digits, '_' or '-', starting with a "
            f"letter; got {name!r}."
        )
    return name


_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
MAX_HEADERS = 8


def parse_headers(lines: Sequence[str], server: str) -> tuple[tuple[str, str], ...]:
    """HTTP headers as "Name: value" lines (blank lines skipped)."""
    headers = []
    for line in lines:
        if not line.strip():
            continue
        name, colon, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not _HEADER_NAME.match(name):
            raise InputError(
                f"The tool server '{server}': a header is written 'Name: value' "
                "(for example 'Authorization: Bearer …')."
            )
        if any(c in value for c in "\r\n\x00") or len(value) > 4096:
            raise InputError(
                f"The tool server '{server}': the header {name}'s value is not usable."
            )
        headers.append((name, value))
    if len(headers) > MAX_HEADERS:
        raise InputError(f"The tool server '{server}': at most {MAX_HEADERS} headers.")
    return tuple(headers)


def parse_server(
    name: str, target: str, timeout_s: float = DEFAULT_TIMEOUT_S, headers: Sequence[str] = ()
) -> ToolServer:
    """A server from what the user typed: an http(s) URL (and the headers it needs), or a
    command line (its secrets go in its environment: `env KEY=value program …`)."""
    name = check_server_name(name)
    target = target.strip()
    if not target:
        raise InputError(f"Give the tool server '{name}' a command to run or a URL.")
    if "\x00" in target or "\n" in target:
        raise InputError(f"The tool server '{name}': the command or URL holds a line break.")
    if not 1 <= timeout_s <= MAX_TIMEOUT_S:
        raise InputError(f"A tool's time limit must be 1 to {MAX_TIMEOUT_S:.0f} seconds.")
    if re.match(r"^[a-z][a-z0-9+.-]*://", target, re.IGNORECASE):
        parts = urlsplit(target)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise InputError(
                f"The tool server '{name}': only http:// and https:// URLs are MCP endpoints "
                f"(streamable HTTP); got {target!r}."
            )
        return ToolServer(
            name, url=target, timeout_s=timeout_s, headers=parse_headers(headers, name)
        )
    if any(line.strip() for line in headers):
        raise InputError(
            f"The tool server '{name}': headers are for a URL; a command takes its secrets in "
            "its environment ('env KEY=value program …')."
        )
    try:
        command = tuple(shlex.split(target))
        if "/" in command[0] and not os.path.isabs(command[0]):
            # A program given by a relative path is found from where it was added, not
            # from wherever the app later starts.
            command = (os.path.abspath(command[0]), *command[1:])
    except ValueError as exc:
        raise InputError(
            f"The tool server '{name}': the command line is not valid ({exc})."
        ) from None
    return ToolServer(name, command=command, timeout_s=timeout_s)


def server_from_record(record: Any) -> ToolServer:
    """A stored server (the record was authenticated; its shape is still checked)."""
    if not isinstance(record, dict):
        raise InputError("A stored tool server is not a record.")
    command = record.get("command") or []
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise InputError("A stored tool server's command is not a list of words.")
    target = str(record.get("url") or "") or shlex.join(command)
    pairs = record.get("headers") or []
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs
    ):
        raise InputError("A stored tool server's headers are not name and value pairs.")
    return parse_server(
        str(record.get("name", "")),
        target,
        float(record.get("timeout_s", 60)),
        [f"{n}: {v}" for n, v in pairs],
    )
