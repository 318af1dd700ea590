"""The turns a picture, a scanned page or a voice memo is read in: a short header, the
model's markers around the embedding positions, and the reply that acknowledges it; and
what the router's words see of such a part (its pixels and samples hold no words)."""

from __future__ import annotations

import re
from pathlib import Path

from galahad_desktop.engine.picture import Media, Sound
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.memory.chat.live import LiveContext

PICTURE_ACK = 'I have looked at "{name}". Ask me about it.'
MEMO_ACK = 'I have listened to "{name}". Ask me about it.'
MEMO_CAPTION = "Voice memo "  # how a memo part's caption starts (what marks it a memo)


def media_header(name: str, part_no: int, n_parts: int, item: Media) -> tuple[str, str]:
    """The header above a picture, scanned page or memo part, and the reply that
    acknowledges it."""
    if isinstance(item, Sound):
        if n_parts == 1:
            return f'Voice memo "{name}":\n', MEMO_ACK.format(name=name)
        return (
            f'Voice memo "{name}", part {part_no} of {n_parts}:\n',
            f'I have listened to part {part_no} of {n_parts} of "{name}".',
        )
    if n_parts == 1:
        return f'Picture "{name}":\n', PICTURE_ACK.format(name=name)
    return (
        f'Scanned document "{name}", page {part_no} of {n_parts}:\n',
        f'I have looked at page {part_no} of {n_parts} of "{name}".',
    )


class MediaTurns:
    """Ledgers for pictures and sounds (a mixin of the documents' room, which has `live`)."""

    live: LiveContext

    @property
    def engine(self) -> ChatEngine:
        return self.live.engine

    def picture_ledger(
        self,
        name: str,
        part_no: int,
        n_parts: int,
        picture: Media,
        index: int = 0,
        opening: bool = True,
    ) -> list[int]:
        """A picture (or one scanned page, or one part of a voice memo) as its own document
        turn: the model's markers around its embedding positions (the ledger's `index`-th
        picture or sound), under a short header, acknowledged. Without `opening` the turn
        continues a context that already holds the user turn's opening (a picture or memo
        put into a conversation)."""
        engine = self.engine
        turns = engine.turns
        header, ack = media_header(name, part_no, n_parts, picture)
        reader = self.live.hearing() if isinstance(picture, Sound) else self.live.vision()
        start = engine.bos() + turns.user_open if opening else []
        return (
            start
            + engine.encode_text(header)
            + reader.ledger(picture, index)
            + turns.user_close
            + turns.generation_prompt
            + engine.encode_text(ack)
            + turns.model_close
        )

    def memo_ledger(
        self, name: str, parts: list[Sound], index: int, opening: bool = True
    ) -> list[int]:
        """A whole memo as one document turn: each part's markers around its audio
        positions (the ledger's `index`-th sound onwards), under a short header."""
        engine = self.engine
        turns = engine.turns
        hearing = self.live.hearing()
        start = engine.bos() + turns.user_open if opening else []
        heard: list[int] = []
        for number, part in enumerate(parts):
            heard += hearing.ledger(part, index + number)
        return (
            start
            + engine.encode_text(f'Voice memo "{name}":\n')
            + heard
            + turns.user_close
            + turns.generation_prompt
            + engine.encode_text(MEMO_ACK.format(name=name))
            + turns.model_close
        )

    def picture_caption(self, name: str, part_no: int, n_parts: int, sound: bool = False) -> str:
        """What the router's words see of a picture or memo part (its pixels and samples
        hold no words): the file's name, also split into words (invoice-2026.pdf: invoice
        2026), and the page or part."""
        words = " ".join(re.split(r"[\W_]+", Path(name).stem)).strip()
        if sound:
            part = f", part {part_no} of {n_parts}" if n_parts > 1 else ""
            return f"{MEMO_CAPTION}{name}: {words}{part}"
        if n_parts == 1:
            return f"Picture {name}: {words}"
        return f"Scanned document {name}: {words}, page {part_no}"
