"""A conversation's own options: its system prompt (a preset by name, or the user's own
words, encrypted) and its sampling over the settings.

A preset is product text and stays a plain name in the sealed record; the user's own words
are private, so they are encrypted (system_enc) and bound into the conversation's seal.
"""

from __future__ import annotations

import json
from typing import Any

from galahad_desktop.errors import InputError, check_text
from galahad_desktop.settings import SYSTEM_PROMPTS, coerce
from galahad_desktop.vault.names import ConversationRow
from galahad_desktop.vault.records import Records
from galahad_desktop.vault.vault import Vault

MAX_SYSTEM_CHARS = 20_000
CUSTOM = "custom"  # the system_prompt column of a conversation with its own words
# ... and of an API conversation whose client offered tools: system_enc then holds
# {"system": words, "tools": [{"name", "description", "parameters"}]} (JSON, encrypted).
WITH_TOOLS = "custom+tools"


def set_system_prompt(records: Records, row: dict[str, Any], system_prompt: str) -> None:
    """Put a new conversation's system prompt into its row: a preset's name, or the user's
    words encrypted (an empty prompt keeps the row's default)."""
    if system_prompt.strip().lower() in SYSTEM_PROMPTS:
        row["system_prompt"] = coerce("system_prompt", system_prompt)
        return
    words = check_text(system_prompt, "The system prompt").strip()
    if not words:
        return
    if len(words) > MAX_SYSTEM_CHARS:
        raise InputError(f"A system prompt can be at most {MAX_SYSTEM_CHARS:,} characters.")
    row["system_prompt"] = CUSTOM
    row["system_enc"] = records.encrypt("conversations", "system_enc", row, words)


def system_text(records: Records, conv: ConversationRow) -> str:
    """The words a conversation's system turn holds."""
    if conv.get("system_enc"):
        words = records.decrypt("conversations", "system_enc", conv)
        if conv.get("system_prompt") == WITH_TOOLS:
            return str(json.loads(words)["system"])
        return words
    return SYSTEM_PROMPTS.get(conv.get("system_prompt") or "none", "")


def system_tools(records: Records, conv: ConversationRow) -> list[dict[str, Any]]:
    """The tools an API client offered in the conversation's system turn ([] for none)."""
    if conv.get("system_prompt") != WITH_TOOLS or not conv.get("system_enc"):
        return []
    tools = json.loads(records.decrypt("conversations", "system_enc", conv))["tools"]
    return list(tools)


def system_value(system: str, tools: list[dict[str, Any]]) -> tuple[str, str]:
    """(system_prompt column, the text to encrypt into system_enc) for a system turn."""
    if not tools:
        return CUSTOM, system
    return WITH_TOOLS, json.dumps({"system": system, "tools": tools}, ensure_ascii=False)


def set_sampling(
    vault: Vault, conversation_id: str, temperature: float | None, max_tokens: int | None
) -> None:
    """A conversation's own creativity and longest reply (None: the settings'), sealed."""
    changes = {
        "temperature": None if temperature is None else coerce("temperature", temperature),
        "max_tokens": None if max_tokens is None else coerce("max_tokens", max_tokens),
    }
    with vault.transaction():
        vault.records.update("conversations", conversation_id, changes)
        vault.records.reseal("conversations", conversation_id)


def own_sampling(conv: ConversationRow) -> dict[str, Any]:
    """What a conversation sets over the settings (temperature, max_tokens)."""
    return {k: conv.get(k) for k in ("temperature", "max_tokens") if conv.get(k) is not None}
