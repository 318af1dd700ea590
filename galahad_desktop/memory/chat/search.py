"""Search over titles and message text: decrypted into memory only (cached per conversation
until it changes), never an index on disk."""

from __future__ import annotations

from galahad_desktop.memory.chat.conversations import Conversations
from galahad_desktop.memory.results import SearchHit


class Search:
    def __init__(self, conversations: Conversations) -> None:
        self.conversations = conversations
        self.cache: dict[str, tuple[float, list[str]]] = {}

    def clear(self) -> None:
        self.cache.clear()

    def find(self, query: str, limit: int = 200) -> list[SearchHit]:
        """Conversations whose title or messages hold every word of `query`. The text is
        decrypted into memory (cached per conversation until it changes): never an index
        on disk."""
        words = [w for w in query.lower().split() if w]
        if not words:
            return []
        hits = []
        for summary in self.conversations.summaries():
            cached = self.cache.get(summary.id)
            if cached is None or cached[0] != summary.updated_at:
                texts = [m.text for m in self.conversations.messages(summary.id)]
                cached = (summary.updated_at, texts)
                self.cache[summary.id] = cached
            title = summary.title.lower()
            body = [t for t in cached[1]]
            everything = title + "\n" + "\n".join(t.lower() for t in body)
            if all(w in everything for w in words):
                snippet = summary.title
                for text in body:
                    at = text.lower().find(words[0])
                    if at >= 0:
                        snippet = " ".join(text[max(0, at - 40) : at + 80].split())
                        break
                hits.append(SearchHit(summary.id, summary.title, snippet))
            if len(hits) >= limit:
                break
        return hits
