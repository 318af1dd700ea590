"""What the window can ask of the core. Runs in the worker thread only; imports no Qt.

Each task takes the request's `stream`, `progress` and `cancel` keywords (used or not) and
returns plain data (dicts, lists) so results cross threads as values, never live objects.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from galahad_desktop.engine.engine import Progress
from galahad_desktop.errors import InputError
from galahad_desktop.memory.library import VerifiedLibrary
from galahad_desktop.memory.service import Galahad, TurnResult
from galahad_desktop.settings import BY_KEY, SETTINGS
from galahad_desktop.vault.keys import KeyStore

Stream = Callable[[str], None]
ProgressCb = Callable[[Progress], None]


class CoreTasks:
    def __init__(
        self,
        data_dir: Path,
        model_path: Path | None = None,
        keystore: KeyStore | None = None,
        passphrase: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.core = Galahad(
            self.data_dir, model_path=model_path, keystore=keystore, passphrase=passphrase
        )
        self.history_path = self.data_dir / "memory-history.jsonl"

    def close(self) -> None:
        self.core.close()

    # -- helpers -------------------------------------------------------------------------
    def _record(self, result: TurnResult | None, graft: dict[str, Any] | None = None) -> None:
        """Append restored-vs-recomputed counts (numbers only) for the Memory view's chart."""
        if result is not None:
            c = result.counters
            entry = {
                "t": time.time(),
                "restored": c.restored_tokens,
                "recomputed": c.recomputed_tokens,
                "restore_ms": c.restore_ms,
                "prefill_ms": c.prefill_ms,
                "library_saved_tokens": 0,
            }
            if (result.library or {}).get("mode") == "recurrence":
                # Decoding the stored answer is what the library saved.
                entry["library_saved_tokens"] = len(self.core.engine.encode_text(result.reply))
        elif graft is not None:
            entry = {
                "t": time.time(),
                "restored": graft["restored_tokens"],
                "recomputed": graft["recomputed_tokens"],
                "restore_ms": graft["restore_ms"],
                "prefill_ms": 0.0,
            }
        else:
            return
        if not (entry["restored"] or entry["recomputed"] or entry.get("library_saved_tokens")):
            return
        fd = os.open(self.history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    def _turn(self, result: TurnResult) -> dict[str, Any]:
        self._record(result)
        out = result.as_dict()
        out["graft_text"] = result.graft.describe() if result.graft else None
        if (result.library or {}).get("mode") in ("recurrence", "transfer"):
            out["graft_text"] = (result.library or {}).get("label")
        out["n_ctx"] = self.core.engine.n_ctx
        return out

    # -- tasks ---------------------------------------------------------------------------
    def open(self, **_: Any) -> dict[str, Any]:
        engine = self.core.engine
        return {
            "model": asdict(engine.model_info()),
            "fingerprint": engine.fingerprint,
            "gpu_layers": engine.gpu_layers,
            "backend": engine.backend,
            "n_ctx": engine.n_ctx,
            "keyring": self.core.vault.keystore.backend_name,
            "turn_format": engine.turns.source,
        }

    def lists(self, **_: Any) -> dict[str, Any]:
        return {
            "conversations": [asdict(c) for c in self.core.list_conversations()],
            "documents": [asdict(d) for d in self.core.list_documents()],
        }

    def new_conversation(self, document_id: str | None = None, **_: Any) -> str:
        return self.core.new_conversation(document_id=document_id)

    def open_conversation(
        self, conversation_id: str, progress: ProgressCb | None = None, **_: Any
    ) -> dict[str, Any]:
        report = self.core.resume(conversation_id, progress=progress)
        graft = report.as_dict()
        self._record(None, graft)
        return {
            "conversation_id": conversation_id,
            "messages": [asdict(m) for m in self.core.messages(conversation_id)],
            "graft": graft,
            "graft_text": report.describe() if report.block_id else None,
            "context_tokens": len(self.core.engine.tokens),
            "n_ctx": self.core.engine.n_ctx,
        }

    @property
    def library(self) -> VerifiedLibrary:
        return VerifiedLibrary(self.core)

    def send(
        self,
        conversation_id: str,
        text: str,
        stream: Stream | None = None,
        cancel: threading.Event | None = None,
        progress: ProgressCb | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        return self._turn(  # through the verified library (each conversation can opt out)
            self.library.ask(
                conversation_id, text, on_text=stream, cancel=cancel, progress=progress
            )
        )

    def mark_verified(self, conversation_id: str, **_: Any) -> dict[str, Any]:
        """Store the conversation's last question and answer in the verified library (a
        checkable answer must pass its check; any other is stored on the user's word)."""
        messages = self.core.messages(conversation_id)
        if len(messages) < 2 or messages[-1].role != "model":
            raise InputError("There is no answer to mark as verified yet.")
        entry = self.library.add(messages[-2].text, messages[-1].text, user_verified=True)
        return asdict(entry)

    def library_entries(self, **_: Any) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.library.entries()]

    def remove_verified(self, entry_id: str, **_: Any) -> bool:
        self.library.remove(entry_id)
        return True

    def set_library(self, conversation_id: str, enabled: bool, **_: Any) -> bool:
        self.library.set_enabled(conversation_id, enabled)
        return enabled

    def library_enabled(self, conversation_id: str, **_: Any) -> bool:
        return self.library.enabled(conversation_id)

    def regenerate(
        self,
        conversation_id: str,
        stream: Stream | None = None,
        cancel: threading.Event | None = None,
        progress: ProgressCb | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        return self._turn(
            self.core.regenerate(conversation_id, on_text=stream, cancel=cancel, progress=progress)
        )

    def branch(
        self,
        conversation_id: str,
        seq: int,
        text: str,
        stream: Stream | None = None,
        cancel: threading.Event | None = None,
        progress: ProgressCb | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        return self._turn(
            self.core.branch(
                conversation_id, seq, text, on_text=stream, cancel=cancel, progress=progress
            )
        )

    def deposit(
        self,
        path: str,
        progress: ProgressCb | None = None,
        cancel: threading.Event | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        return self.core.deposit(Path(path), progress=progress, cancel=cancel).as_dict()

    def forget(self, item_id: str, **_: Any) -> dict[str, Any]:
        return self.core.forget(item_id)

    def ask(
        self,
        question: str,
        document_id: str | None = None,
        part_id: str | None = None,
        stream: Stream | None = None,
        cancel: threading.Event | None = None,
        progress: ProgressCb | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        """A routed question (library or one long document); candidates when unsure."""
        result = self.core.ask(
            question, document_id, part_id, on_text=stream, cancel=cancel, progress=progress
        )
        if result.graft is not None:
            self._record(None, result.graft.as_dict())
        out = result.as_dict()
        out["candidates"] = [
            {**c, "citation": self.core.citation(c["part_id"])}
            for c in out["routing"]["candidates"]
        ]
        return out

    def add_document(
        self,
        conversation_id: str,
        path: str,
        progress: ProgressCb | None = None,
        cancel: threading.Event | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        """Stack a document on an ongoing conversation (only the new one is read)."""
        source = Path(path)
        result = self.core.add_document_file(
            conversation_id, source, progress=progress, cancel=cancel
        )
        out = self._turn(result)
        out["name"] = source.name
        out["messages"] = [asdict(m) for m in self.core.messages(conversation_id)]
        return out

    def compact_if_needed(self, conversation_id: str, **_: Any) -> dict[str, Any] | None:
        """Run after a turn, on the worker thread: merge a long chain's older links."""
        if not self.core.needs_compaction(conversation_id):
            return None
        return self.core.compact(conversation_id)

    def rotate_key(self, **_: Any) -> dict[str, Any]:
        blocks = len(self.core.vault.catalog.rows("blocks"))
        return {"key_id": self.core.vault.rotate_master_key(), "blocks": blocks}

    def lock(self, **_: Any) -> bool:
        self.core.lock()
        return True

    def unlock(self, **_: Any) -> bool:
        self.core.unlock()
        return True

    def audit(self, repair: bool = False, **_: Any) -> dict[str, Any]:
        return self.core.vault.audit(repair=repair).as_dict()

    def security(self, **_: Any) -> dict[str, Any]:
        vault = self.core.vault
        return {
            "keyring": vault.keystore.backend_name,
            "key_id": vault.key_id,
            "locked": vault.locked,
            "data_dir": str(self.data_dir),
        }

    def memory(self, **_: Any) -> dict[str, Any]:
        stats = self.core.memory_stats()
        history: list[dict[str, Any]] = []
        if self.history_path.exists():
            for line in self.history_path.read_text("utf-8").splitlines()[-500:]:
                try:
                    history.append(json.loads(line))
                except ValueError:
                    continue
        stats["history"] = history
        stats["restored_tokens_total"] = sum(h["restored"] for h in history)
        stats["library_saved_tokens_total"] = sum(h.get("library_saved_tokens", 0) for h in history)
        stats["library"] = [asdict(e) for e in self.library.entries()]
        stats["library_saved_tokens_total"] = sum(h.get("library_saved_tokens", 0) for h in history)
        stats["library"] = [asdict(e) for e in self.library.entries()]
        stats["recomputed_tokens_total"] = sum(h["recomputed"] for h in history)
        return stats

    def settings(self, **_: Any) -> dict[str, Any]:
        return {
            "values": self.core.settings.as_dict(),
            "declared": [
                {
                    "key": s.key,
                    "type": s.type.__name__,
                    "default": s.default,
                    "description": s.description,
                    "runtime": s.runtime,
                    "choices": s.choices,
                    "minimum": s.minimum,
                }
                for s in SETTINGS
            ],
        }

    def update_settings(self, changes: dict[str, Any], **_: Any) -> dict[str, Any]:
        runtime_changed = self.core.settings.update(changes)
        if runtime_changed:
            self.core.reload_engine()
        return {"runtime_changed": runtime_changed, "values": self.core.settings.as_dict()}

    def inspect_model(self, path: str, **_: Any) -> dict[str, Any]:
        """Read a GGUF's metadata (vocabulary only, no weights) for the settings dialog."""
        from galahad_desktop.engine.engine import inspect_gguf

        return inspect_gguf(Path(path))

    def download_model(
        self,
        repo_id: str,
        filename: str,
        progress: ProgressCb | None = None,
        cancel: threading.Event | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        from galahad_desktop.models import download_gguf

        start = time.monotonic()

        def report(have: int, total: int) -> None:
            if progress is not None:
                progress(Progress(have, total, time.monotonic() - start))

        done = download_gguf(
            repo_id, filename, self.data_dir / "models", progress=report, cancel=cancel
        )
        return {"path": str(done.path), "sha256": done.sha256, "bytes": done.size}

    def runtime_keys(self, **_: Any) -> list[str]:
        return [key for key, s in BY_KEY.items() if s.runtime]
