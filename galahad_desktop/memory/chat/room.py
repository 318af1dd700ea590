"""Whether a message fits the context, said in words that offer only what can work."""

from __future__ import annotations

from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.errors import InputError


def message_too_long(needed: int, n_ctx: int) -> str:
    """What a message longer than any conversation can hold is told: only what can work."""
    return (
        f"The message alone needs {needed:,} tokens with its reply, more than this model's "
        f"context holds ({n_ctx:,}). Shorten it, or add it as a document: a long document "
        "is read in parts and asked about."
    )


def check_room(engine: ChatEngine, needed: int, first_turn: bool) -> None:
    """Refuse a message the context has no room for, with its reply (`needed` tokens in
    all), saying only what can work: a new chat was offered for a first message, and
    failed."""
    if needed > engine.room():
        if needed > engine.n_ctx:
            raise InputError(message_too_long(needed, engine.n_ctx))
        if first_turn:
            raise InputError(
                f"The message needs {needed:,} tokens with its reply; this new "
                f"conversation has room for {engine.room():,} (its system prompt takes "
                "the rest). Shorten the message or the system prompt, or add the text "
                "as a document: a long document is read in parts and asked about."
            )
        raise InputError(
            f"This conversation has {len(engine.tokens):,} of {engine.n_ctx:,} context "
            f"tokens; the message needs {needed:,} more with its reply. Start a new "
            "conversation (or continue from a summary)."
        )
