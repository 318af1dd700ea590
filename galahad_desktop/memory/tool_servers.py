"""The MCP servers the window's chats may use, and the tools the user allowed to run without
asking: kept in the catalog, encrypted and authenticated like every record (a server's
command line or URL can hold a token)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from galahad_desktop.errors import InputError, IntegrityError, NotFoundError
from galahad_desktop.toolbox.servers import (
    DEFAULT_TIMEOUT_S,
    ToolServer,
    parse_server,
    server_from_record,
)
from galahad_desktop.vault.crypto import DecryptionFailed
from galahad_desktop.vault.vault import Vault

META_KEY = "tool_servers"
MAX_SERVERS = 32


@dataclass(frozen=True)
class ToolConfig:
    servers: tuple[ToolServer, ...] = ()
    always: frozenset[str] = field(default_factory=frozenset)  # "server/tool"


class ToolServers:
    def __init__(self, vault: Vault) -> None:
        self.vault = vault

    def load(self) -> ToolConfig:
        try:
            raw = self.vault.records.secret_setting(META_KEY, self.vault.vault_id)
            if raw is None:
                return ToolConfig()
            stored = json.loads(raw)
            servers = tuple(server_from_record(r) for r in stored["servers"])
            always = frozenset(str(a) for a in stored["always"])
        except (DecryptionFailed, ValueError, KeyError, TypeError, InputError):
            raise IntegrityError(
                "The list of tool servers failed authentication (the catalog was edited); "
                "refused. Remove and add the servers again in Settings → Tools."
            ) from None
        return ToolConfig(servers, always)

    def _save(self, config: ToolConfig) -> None:
        raw = json.dumps(
            {"servers": [s.record() for s in config.servers], "always": sorted(config.always)}
        ).encode("utf-8")
        with self.vault.transaction():
            self.vault.records.put_secret_setting(META_KEY, raw, self.vault.vault_id)

    def server(self, name: str) -> ToolServer:
        for server in self.load().servers:
            if server.name == name:
                return server
        raise NotFoundError(f"No tool server is named '{name}' (Settings → Tools lists them).")

    def add(
        self,
        name: str,
        target: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        headers: Sequence[str] = (),
        check: Callable[[ToolServer], None] | None = None,
    ) -> ToolServer:
        """Store a server; `check` (which raises) runs first, so nothing is stored when it
        fails."""
        server = parse_server(name, target, timeout_s, headers)
        config = self.load()
        if any(s.name == server.name for s in config.servers):
            raise InputError(f"A tool server is already named '{server.name}'.")
        if len(config.servers) >= MAX_SERVERS:
            raise InputError(f"At most {MAX_SERVERS} tool servers can be added.")
        if check is not None:
            check(server)
        self._save(replace(config, servers=(*config.servers, server)))
        return server

    def remove(self, name: str) -> None:
        config = self.load()
        self.server(name)
        self._save(
            ToolConfig(
                tuple(s for s in config.servers if s.name != name),
                frozenset(a for a in config.always if not a.startswith(name + "/")),
            )
        )

    def allowed(self, server: str, tool: str) -> bool:
        return f"{server}/{tool}" in self.load().always

    def allow_always(self, server: str, tool: str) -> None:
        config = self.load()
        self._save(replace(config, always=config.always | {f"{server}/{tool}"}))
