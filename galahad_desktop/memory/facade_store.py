"""The facade's store half: the verified library, proofs and audit, forgetting, keys,
backups and usage. Mixed into `Galahad` (memory/galahad.py), which front ends call; it holds
no state of its own."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from galahad_desktop.errors import InputError
from galahad_desktop.memory.maintenance import Maintenance
from galahad_desktop.memory.results import (
    ForgetResult,
    GiveBackResult,
    KeyStatus,
    MemoryStats,
    Message,
    RotateResult,
    StorageReport,
    StoredItem,
    VerifyResult,
)
from galahad_desktop.memory.storage import Storage, budget_for
from galahad_desktop.memory.usage import Usage
from galahad_desktop.memory.verified.library import Entry, VerifiedLibrary
from galahad_desktop.memory.verified.verifiers import Verdict
from galahad_desktop.settings import Settings
from galahad_desktop.vault import custody, restoring
from galahad_desktop.vault.keys import open_keystore
from galahad_desktop.vault.vault import AuditReport, Vault


class StoreFacade:
    vault: Vault
    maintenance: Maintenance
    library: VerifiedLibrary
    usage: Usage
    storage_room: Storage
    settings: Settings

    if TYPE_CHECKING:  # Galahad's

        def messages(self, conversation_id: str) -> list[Message]: ...

    # -- the verified library ------------------------------------------------------------
    def verified_check(self, question: str, answer: str) -> Verdict | None:
        """Check an answer with the verifier that can (None when none can)."""
        return self.library.check(question, answer)

    def verified_add(self, question: str, answer: str, user_verified: bool = False) -> Entry:
        """Store a verified answer (checked when a verifier can; else on the user's word)."""
        return self.library.add(question, answer, user_verified)

    def verified_entries(self) -> list[Entry]:
        """Every verified answer in the library."""
        return self.library.entries()

    def verified_remove(self, entry_id: str) -> None:
        """Delete a verified answer."""
        self.library.remove(entry_id)

    def mark_verified(self, conversation_id: str) -> Entry:
        """Store the conversation's last question and answer as verified (a checkable answer
        must pass its check; any other is stored on the user's word)."""
        messages = self.messages(conversation_id)
        if len(messages) < 2 or messages[-1].role != "model" or messages[-2].role != "user":
            raise InputError("There is no answer to mark as verified yet.")
        return self.library.add(messages[-2].text, messages[-1].text, user_verified=True)

    def set_library(self, conversation_id: str, enabled: bool) -> None:
        """Turn the verified-answer library on or off for a conversation."""
        self.library.set_enabled(conversation_id, enabled)

    def library_enabled(self, conversation_id: str) -> bool:
        """Whether the conversation answers through the verified-answer library."""
        return self.library.enabled(conversation_id)

    # -- proofs, audit, forgetting, keys, usage --------------------------------------------
    def verify(self, item_id: str | None = None) -> list[VerifyResult]:
        """Re-run the graft proofs of one item's blocks, or of every block."""
        return self.maintenance.verify(item_id)

    def audit(self, repair: bool = False) -> AuditReport:
        """Check every block file and every catalog record against its seal; `repair`
        removes only what Galahad wrote."""
        return self.maintenance.audit(repair)

    def forget(self, item_id: str) -> ForgetResult:
        """Delete a conversation or a document with its blocks, their keys and everything
        that names it."""
        return self.maintenance.forget(item_id)

    def key_status(self) -> KeyStatus:
        """The master keys: which is active, which are retired, which backups need which."""
        return self.maintenance.key_status()

    def rotate_key(self) -> RotateResult:
        """Make a new master key and re-wrap every block's key under it; the old one is
        retired."""
        return self.maintenance.rotate_key()

    def backup(self, dest: Path) -> custody.BackupResult:
        """A consistent, still-encrypted copy of this data directory (catalog and blocks)."""
        return custody.backup(self.vault, Path(dest))

    def backups(self) -> list[custody.BackupRecord]:
        """The backups taken of this data directory, and the key each needs."""
        return custody.backups(self.vault)

    def export_recovery_kit(self, passphrase: str, out: Path) -> list[str]:
        """The master keys (active and retired) wrapped under a recovery passphrase."""
        return custody.export_kit(self.vault, passphrase, Path(out))

    def drop_retired_keys(self, confirmed: bool) -> tuple[list[str], list[str]]:
        """Delete retired master keys from the keyring (`confirmed`); returns (dropped,
        backups they strand)."""
        dropped, stranded = custody.drop_retired(self.vault, confirmed)
        return dropped, [b.path for b in stranded]

    @staticmethod
    def restore(
        backup_dir: Path, data_dir: Path, passphrase: str | None = None
    ) -> tuple[restoring.RestoreResult, AuditReport]:
        """Make a backup (or an older copy) the data directory, on purpose: it is opened
        (accepting its older generation) and audited before what was there is set aside."""

        def check(path: Path) -> AuditReport:
            vault = Vault(path, open_keystore(path, passphrase), inspect_only=True)
            try:
                return vault.audit()
            finally:
                vault.close()

        def accept(path: Path) -> None:
            Vault(path, open_keystore(path, passphrase), accept_older=True).close()

        return restoring.restore(Path(backup_dir), Path(data_dir), check, accept)

    @staticmethod
    def import_recovery_kit(
        data_dir: Path,
        kit: Path,
        kit_passphrase: str | Callable[[], str],
        passphrase: str | None = None,
    ) -> list[str]:
        """Put the master keys from a recovery kit back into the keystore of `data_dir`."""
        keystore = open_keystore(Path(data_dir), passphrase)
        return custody.import_kit(Path(data_dir), keystore, Path(kit), kit_passphrase)

    def memory_stats(self) -> MemoryStats:
        """Restored against recomputed tokens over recent requests (the Memory view)."""
        on_disk, budget, _rule = budget_for(self.vault.data_dir, self.settings.values.disk_budget)
        return dataclasses.replace(self.usage.stats(), on_disk_bytes=on_disk, budget_bytes=budget)

    # -- the disk budget ----------------------------------------------------------------
    def storage(self) -> StorageReport:
        """What kept memory takes on disk, item by item, against the disk budget."""
        return self.storage_room.report()

    @staticmethod
    def disk_use(data_dir: Path, chosen: int | None) -> tuple[int, int, str]:
        """(bytes the data directory holds, the disk budget, where it comes from) for the
        setting's value `chosen`, without opening anything (the Settings dialog)."""
        return budget_for(Path(data_dir), chosen)

    def give_back(self, item_id: str) -> GiveBackResult:
        """Delete a conversation's or document's blocks now to free disk space; its
        messages, title and text stay, and the next open re-reads it once."""
        return self.storage_room.give_back(item_id)

    def keep(self, item_id: str, kept: bool = True) -> StoredItem:
        """Pin a conversation or document (its blocks are never given back), or unpin it."""
        return self.storage_room.keep(item_id, kept)

    def given_back_since(self) -> list[GiveBackResult]:
        """What the disk budget gave back since the last call (for a front end to say)."""
        done, self.storage_room.given_back = self.storage_room.given_back, []
        return done
