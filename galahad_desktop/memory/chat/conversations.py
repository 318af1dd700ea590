"""Conversations: turns, regenerate, branch, resume — each turn a checkpoint at its boundary.

A turn appends tokens to the ledger (never re-renders the history): the user's text, the end
of the user turn, the generation prompt, the reply, the turn's close and the next turn's
opening (the proof probe). A thinking turn's thoughts are streamed and shown but not kept:
the context returns to the start of the reply and re-reads only the answer, so the stored
history is what the model's template renders for history, and a resumed conversation holds
exactly the tokens an uninterrupted one does.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from galahad_desktop.engine.picture import WAV_MAGIC, Media, Sound, media_from_kept
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.errors import (
    MAX_TITLE_CHARS,
    InputError,
    IntegrityError,
    NotFoundError,
    check_text,
)
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.chat.shared_prompts import SharedPrompts
from galahad_desktop.memory.chat.system_prompt import (
    set_system_prompt,
    system_text,
    system_tools,
)
from galahad_desktop.memory.chat.versions import Versions
from galahad_desktop.memory.results import (
    ConversationMemory,
    ConversationSummary,
    Message,
    ToolCall,
)
from galahad_desktop.vault.names import (
    ConversationRow,
    DocumentRow,
    MessageRow,
    given_back,
)
from galahad_desktop.vault.vault import new_id

TITLE_CHARS = 60
PREVIEW_CHARS = 120


class Conversations:
    def __init__(self, live: LiveContext) -> None:
        self.live = live
        self.vault = live.vault
        self.records = live.records
        self.versions = Versions(live, self.check)
        self.shared = SharedPrompts(live)

    @property
    def engine(self) -> ChatEngine:
        return self.live.engine

    # -- records -------------------------------------------------------------------------
    def check(self, conversation_id: str) -> None:
        """The conversation's record matches its seal, or IntegrityError names it."""
        self.records.check("conversations", self.row(conversation_id))

    def row(self, conversation_id: str) -> ConversationRow:
        row = self.records.conversation(conversation_id)
        if row is None:
            raise NotFoundError(f"No conversation has the id '{conversation_id}'.")
        return row

    def document_row(self, document_id: str) -> DocumentRow:
        row = self.records.document(document_id)
        if row is None:
            raise NotFoundError(f"No document has the id '{document_id}'.")
        return row

    def title(self, row: ConversationRow) -> str:
        return self.records.decrypt("conversations", "title_enc", row)

    def summary(self, r: ConversationRow) -> ConversationSummary:
        try:
            title, damaged = self.title(r), ""
        except IntegrityError:
            # One damaged title must not hide every other conversation: listed and marked
            # (opening it is still refused; `galahad audit` names the problem).
            title, damaged = "(damaged record)", "its title failed authentication"
        memory, block_bytes, returned = self.memory(r)
        return ConversationSummary(
            r["id"],
            title,
            r["document_id"],
            r["n_tokens"] or 0,
            r["n_messages"] or 0,
            r["updated_at"],
            r["created_at"] or 0.0,
            bool(r.get("thinking")),
            r.get("model_sha256") or "",
            damaged,
            "" if damaged else self.preview(r["id"]),
            "damaged" if damaged else memory,
            block_bytes,
            r.get("origin") or "",
            returned,
            bool(r.get("kept")),
        )

    def preview(self, conversation_id: str) -> str:
        """The start of the last message, on one line (what the sidebar shows under a title)."""
        rows = self.message_rows(conversation_id)
        for row in reversed(rows[-6:]):  # a tool step's result (JSON) or empty close is skipped
            if row.get("role") == "tool":
                continue
            if row.get("stop") == "tool_calls":
                return "Called a tool"
            try:
                text = self.records.decrypt("messages", "text_enc", row)
            except IntegrityError:
                return ""
            if text.strip():
                return " ".join(text.split())[:PREVIEW_CHARS]
        return ""

    def memory(self, row: ConversationRow) -> tuple[ConversationMemory, int, bool]:
        """Whether the conversation's KV is kept and usable under this runtime (a graft), or
        will be re-read once; its blocks' bytes on disk; whether some were given back to
        the disk budget."""
        head = row["head_block_id"]
        if not head:
            return "not stored", 0, False
        try:
            chain = self.vault.chain_rows(str(head))
        except (IntegrityError, NotFoundError):
            return "damaged", 0, False
        # A size is bookkeeping, not sealed: an edited cell counts as nothing, never a crash.
        size = sum(
            b if isinstance(b := link.get("file_bytes"), int) and not given_back(link) else 0
            for link in chain
        )
        fingerprint = self.engine.fingerprint
        usable = all(link["fingerprint"] == fingerprint and not given_back(link) for link in chain)
        returned = any(given_back(link) for link in chain)
        return ("stored" if usable else "needs re-reading"), size, returned

    def summaries(self) -> list[ConversationSummary]:
        return [self.summary(r) for r in self.records.conversations("updated_at desc")]

    def message_rows(self, conversation_id: str) -> list[MessageRow]:
        return self.records.messages(conversation_id)

    def first_user_text(self, conv: ConversationRow) -> str | None:
        """The words of the conversation's first message when it is the user's."""
        rows = self.message_rows(conv["id"])[:1]
        if conv["document_id"] or not rows or rows[0]["role"] != "user":
            return None
        return self.records.decrypt("messages", "text_enc", rows[0])

    def messages(self, conversation_id: str) -> list[Message]:
        """The transcript, checked against the conversation's seal first: an edited,
        moved, dropped or reordered message is refused, never shown."""
        self.records.check("conversations", self.row(conversation_id))
        records = self.records
        rows = self.message_rows(conversation_id)
        places = self.versions.places(conversation_id, rows)
        out = []
        for r in rows:
            kept = (
                base64.b64decode(records.decrypt("messages", "image_enc", r))
                if r.get("image_enc")
                else None
            )
            sound = kept is not None and kept.startswith(WAV_MAGIC)
            out.append(
                Message(
                    r["id"],
                    r["role"],
                    records.decrypt("messages", "text_enc", r),
                    r["created_at"],
                    r["tok_start"],
                    r["tok_end"],
                    r["block_id"],
                    records.decrypt("messages", "thought_enc", r) if r.get("thought_enc") else "",
                    None if sound else kept,
                    kept if sound else None,
                    r.get("seed"),
                    *places.get(r["seq"], (1, 1)),
                    str(r.get("stop") or ""),
                    self.calls(r),
                )
            )
        return out

    def calls(self, row: MessageRow) -> tuple[ToolCall, ...]:
        """The tool calls a model reply made (kept, encrypted, as its content)."""
        if row["role"] != "model" or not row.get("content_enc"):
            return ()
        made = json.loads(self.records.decrypt("messages", "content_enc", row))
        return tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in made)

    def message_pictures(self, conversation_id: str, end: int | None = None) -> list[Media]:
        """The pictures and sounds put into a conversation before ledger position `end`, in
        ledger order (a memo as the parts it was heard in)."""
        out: list[Media] = []
        for r in self.message_rows(conversation_id):
            if r.get("image_enc") and (end is None or r["tok_start"] < end):
                kept = base64.b64decode(self.records.decrypt("messages", "image_enc", r))
                item = media_from_kept(kept)
                out += item.parts() if isinstance(item, Sound) else [item]
        return out

    def document_content(self, row: MessageRow) -> str:
        """The text of a document put into the conversation (kept, encrypted, so the turn
        can be re-read under another model or in a continuation)."""
        if not row.get("content_enc"):
            raise InputError(
                "This conversation holds a document added before its text was kept; it "
                "cannot be re-read. Open it with the model and settings it was made with."
            )
        return self.records.decrypt("messages", "content_enc", row)

    def head_block(self, conversation_id: str) -> str:
        head = self.row(conversation_id)["head_block_id"]
        if not head:
            raise InputError(f"Conversation {conversation_id} has no stored turn yet.")
        return str(head)

    def chain_owners(self, owner_id: str) -> set[str]:
        """Who may own the links of an owner's chains: itself and, for a conversation on a
        document, that document (its block is the chain's root)."""
        owners = {owner_id}
        conv = self.records.conversation(owner_id)
        if conv is not None and conv["document_id"]:
            owners.add(conv["document_id"])
        return owners

    # -- creating, naming ----------------------------------------------------------------
    def create(
        self,
        document_id: str | None = None,
        title: str = "",
        system_prompt: str | None = None,
        thinking: bool | None = None,
    ) -> str:
        if document_id is not None:
            self.document_row(document_id)
        settings = self.live.settings
        thinking = settings.values.thinking if thinking is None else thinking
        conversation_id = new_id("c")
        now = time.time()
        row: dict[str, Any] = {
            "id": conversation_id,
            "document_id": document_id,
            "head_block_id": None,
            "n_tokens": 0,
            "n_messages": 0,
            "system_prompt": settings.values.system_prompt,
            "thinking": 1 if thinking else 0,
            "created_at": now,
            "updated_at": now,
        }
        if system_prompt is not None:
            set_system_prompt(self.records, row, system_prompt)
        row["title_enc"] = self.records.encrypt("conversations", "title_enc", row, title)
        with self.vault.transaction():
            self.records.insert("conversations", row)
        return conversation_id

    def rename(self, conversation_id: str, title: str) -> ConversationSummary:
        title = " ".join(check_text(title, "The title").split())
        if not title:
            raise InputError("A conversation's title cannot be empty.")
        if len(title) > MAX_TITLE_CHARS:
            raise InputError(f"A conversation's title can be at most {MAX_TITLE_CHARS} characters.")
        self.row(conversation_id)
        with self.vault.transaction():
            self.records.update(
                "conversations",
                conversation_id,
                {
                    "title_enc": self.records.encrypt(
                        "conversations", "title_enc", {"id": conversation_id}, title
                    )
                },
            )
        return self.summary(self.row(conversation_id))

    def set_thinking(self, conversation_id: str, enabled: bool) -> None:
        """Thinking is switched on in the conversation's first tokens (Gemma 4's system
        turn), so it can change only before the first turn."""
        conv = self.row(conversation_id)
        if enabled and not self.engine.turns.supports_thinking:
            raise InputError(
                f"This model ({self.engine.turn_format.describe()}) has no thinking mode."
            )
        if bool(conv.get("thinking")) == enabled:
            return
        if conv["n_messages"] or conv["head_block_id"] or conv["document_id"]:
            raise InputError(
                "Thinking is set when a conversation starts; start a new conversation to "
                f"turn it {'on' if enabled else 'off'}."
            )
        with self.vault.transaction():
            self.records.update("conversations", conversation_id, {"thinking": int(enabled)})
            self.records.reseal("conversations", conversation_id)
        self.live.drop({conversation_id})

    def system_text(self, conv: ConversationRow) -> str:
        return system_text(self.records, conv)

    def system_tools(self, conv: ConversationRow) -> list[dict[str, Any]]:
        return system_tools(self.records, conv)
