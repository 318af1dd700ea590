"""What custody (backups, generations, kits) and the audit need of the vault they serve.

The vault calls them with itself; they take it as this Protocol, so neither imports the
vault's module (no import circle), and mypy checks that Vault provides it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from galahad_desktop.vault import blockfile, crypto
from galahad_desktop.vault.catalog import Catalog
from galahad_desktop.vault.keys import KeyStore
from galahad_desktop.vault.names import BlockRow
from galahad_desktop.vault.records import Records


class HeldVault(Protocol):
    data_dir: Path
    blocks_dir: Path
    catalog: Catalog
    records: Records
    keystore: KeyStore
    generation: int

    @property
    def vault_id(self) -> str: ...
    @property
    def key_id(self) -> str: ...
    @property
    def fields(self) -> crypto.FieldCipher: ...
    def retired_key_ids(self) -> list[str]: ...
    def block_tokens(self, row: BlockRow) -> list[int]: ...
    def authenticate_file(
        self, row: BlockRow, path: Path, header: blockfile.BlockHeader
    ) -> dict[str, Any]: ...
