"""A conversation copied up to a turn boundary: the start of a branch (Edit in the window)
and of an API request whose history leaves a stored conversation part way through.

The copy's messages are the original's (re-encrypted, bound to their new place); its chain
starts afresh from what the context holds, so forgetting the original never breaks it.
"""

from __future__ import annotations

import time
from typing import Any

from galahad_desktop.vault.names import ConversationRow, MessageRow
from galahad_desktop.vault.vault import Vault, new_id

# What a person chose for a conversation, which a branch or a continuation of it keeps.
OWN_CHOICES = ("temperature", "max_tokens", "library", "thinking")


def own_choices(conv: ConversationRow) -> dict[str, Any]:
    """The conversation's own choices (its creativity, longest reply, verified-answer
    library, thinking), to carry into a conversation made from it."""
    return {key: conv.get(key) for key in OWN_CHOICES}


def copy_conversation(
    vault: Vault,
    conv: ConversationRow,
    rows: list[MessageRow],
    seq: int,
    title: str,
    origin: str | None = None,
) -> str:
    """A new conversation holding messages [0, seq) of `conv` (one transaction); its id."""
    records = vault.records
    copy_id = new_id("c")
    now = time.time()
    with vault.transaction():
        copy: ConversationRow = {
            "id": copy_id,
            "document_id": conv["document_id"],
            "head_block_id": None,
            "n_tokens": 0,
            "n_messages": seq,
            "system_prompt": conv.get("system_prompt"),
            **own_choices(conv),  # type: ignore[typeddict-item]
            "thinking": conv.get("thinking") or 0,
            "model_sha256": conv.get("model_sha256"),
            "origin": origin,
            "created_at": now,
            "updated_at": now,
        }
        if conv.get("system_enc"):  # as kept: the words, or the words and the tools offered
            copy["system_enc"] = records.encrypt(
                "conversations",
                "system_enc",
                copy,
                records.decrypt("conversations", "system_enc", conv),
            )
        copy["title_enc"] = records.encrypt("conversations", "title_enc", copy, title)
        records.insert("conversations", copy)
        for row in rows[:seq]:
            records.add_message(
                {**row, "id": new_id("m"), "conversation_id": copy_id, "block_id": None},
                records.decrypt("messages", "text_enc", row),
                content=records.decrypt("messages", "content_enc", row)
                if row.get("content_enc")
                else "",
            )
        records.reseal("conversations", copy_id)
    return copy_id
