"""An MCP server as the user added it: a name, and a command line (stdio) or a URL
(streamable HTTP). Checked once, here, whichever front end adds it."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

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

    @property
    def target(self) -> str:
        """The command line or URL, as the user typed it (for the Tools page)."""
        return self.url or shlex.join(self.command)

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": list(self.command),
            "url": self.url,
            "timeout_s": self.timeout_s,
        }


def check_server_name(name: str) -> str:
    name = name.strip()
    if not _NAME.match(name):
        raise InputError(
            f"A tool server's name must be 1-32 letters, digits, '_' or '-', starting with a "
            f"letter; got {name!r}."
        )
    return name


def parse_server(name: str, target: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> ToolServer:
    """A server from what the user typed: an http(s) URL, or a command line."""
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
        return ToolServer(name, url=target, timeout_s=timeout_s)
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
    return parse_server(str(record.get("name", "")), target, float(record.get("timeout_s", 60)))
