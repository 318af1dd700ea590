"""Typed text never becomes markup.

llama.cpp matches *user-defined* tokens inside raw text even with parse_special=False, and
Gemma 4 stores its channel and tool markers (`<|channel>`, `<channel|>`, `<|tool_call>`, …)
as user-defined tokens: a message or a document containing one would become that marker.
User and document text is therefore tokenized around every marker: the text is cut just after
the first character of each occurrence, so no piece holds a whole marker and every marker
stays characters. Control tokens (`<|turn>`, `<start_of_turn>`) are never matched in raw text.

Whitespace runs that some vocabularies store as user-defined (Gemma 3's newline and space
runs) are ordinary text and are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable


class MarkupGuard:
    """Splits text so that none of `markers` can be matched by the tokenizer."""

    def __init__(self, markers: Iterable[str]) -> None:
        kept = sorted({m for m in markers if len(m) >= 2 and m.strip()}, key=len, reverse=True)
        self.markers = tuple(kept)
        self._pattern = re.compile("|".join(re.escape(m) for m in kept)) if kept else None

    def pieces(self, text: str) -> list[str]:
        """Consecutive pieces of `text` (joined, they are `text`), none holding a marker."""
        if self._pattern is None:
            return [text]
        out: list[str] = []
        rest = text
        while True:
            found = self._pattern.search(rest)
            if found is None:
                out.append(rest)
                return out
            cut = found.start() + 1  # the marker's first character ends this piece
            out.append(rest[:cut])
            rest = rest[cut:]

    def tokenize(self, text: str, tokenize_plain: Callable[[str], list[int]]) -> list[int]:
        tokens: list[int] = []
        for piece in self.pieces(text):
            if piece:
                tokens.extend(tokenize_plain(piece))
        return tokens
