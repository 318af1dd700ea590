"""Which stored part answers a question: lexical scoring with SQLite's FTS5 (BM25).

Parts' text is encrypted at rest, so the index lives only in memory: it is built from the
decrypted parts after unlock and dropped on lock. A confidence gate refuses to pick when the
best score is weak, or not clearly ahead of the runner-up; the caller then shows candidates.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import snowballstemmer

from galahad_desktop.errors import InputError

_WORD = re.compile(r"\w+", re.UNICODE)
# Words that say what kind of question it is, not what it is about.
STOPWORDS = frozenset(
    """a an and are as at be by can did do does for from has have how i in is it its me my
    of on or our please tell that the their there this to was were what when where which who
    whom whose why will with you your about document part""".split()
)


RoutingMethod = Literal["lexical", "hybrid", "lexical+rerank", "hybrid+rerank"]
RERANKED: dict[RoutingMethod, RoutingMethod] = {
    "lexical": "lexical+rerank",
    "hybrid": "hybrid+rerank",
    "lexical+rerank": "lexical+rerank",
    "hybrid+rerank": "hybrid+rerank",
}


@dataclass(frozen=True)
class Candidate:
    part_id: str
    document_id: str
    part_no: int
    n_parts: int
    score: float  # BM25; with an embedding model, the fused rank score
    coverage: float  # share of the question's IDF weight found in this part (or passage)
    similarity: float | None = None  # cosine similarity of its closest passage (hybrid)


@dataclass
class RouteDecision:
    question_terms: list[str]
    candidates: list[Candidate]
    best_score: float  # BM25 (higher is better)
    margin: float  # best / runner-up (inf when there is no runner-up)
    confident: bool
    reason: str = ""
    scope: str = "library"
    strength: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    cited: list[Candidate] = field(default_factory=list)  # the parts an answer comes from
    # with an embedding model's similarity (hybrid) or not; "+rerank" when the model chose
    method: RoutingMethod = "lexical"

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def explain(self) -> str:
        """Why the question was answered or refused, in words."""
        if not self.candidates:
            return "Not answered: no stored document holds any of the question's words."
        best = self.candidates[0]
        if "across" in self.extra:
            return self.explain_across()
        rerank = self.extra.get("rerank")
        if rerank is not None:
            return self._explain_reranked(best, rerank)
        if self.confident:
            hybrid = self.method == "hybrid"
            if self.margin == float("inf"):
                lead = "no other document comes close"
            elif hybrid:
                lead = f"{self.margin:.2f}× ahead of any other document"
            else:
                lead = f"{self.margin:.1f}× more than any other document"
            also = "".join(
                f"; part {c.part_no} of the same document matches almost as well and is cited too"
                for c in self.cited[1:]
            )
            if not hybrid:
                holds = f"it holds {self.strength:.0%} of what the question asks about"
            elif self.extra.get("by_words"):
                holds = (
                    f"its best passage holds {best.coverage:.0%} of the question's words as "
                    "written (a name or a code found word for word)"
                )
            else:
                holds = (
                    f"its closest passage means {best.similarity or 0.0:.0%} the same as the "
                    f"question and holds {best.coverage:.0%} of its words"
                )
            return f"Answered from part {best.part_no} of {best.n_parts}: {holds}, {lead}{also}."
        return f"Not answered: {self.reason}."

    def explain_across(self, names: list[str] | None = None) -> str:
        """An answer from several parts read together (memory/retrieval/across.py); each
        part by its citation when `names` gives them (the router knows no names)."""
        info = self.extra["across"]
        documents = len({c.document_id for c in self.cited})
        named = names if names and len(names) == len(self.cited) else None
        held = ", ".join(
            f"{named[i] if named else f'part {c.part_no} of {c.n_parts}'} holds {share:.0%}"
            for i, (c, share) in enumerate(zip(self.cited, info["each"], strict=True))
        )
        why = (
            "no one of them holds it all"
            if max(info["each"]) < info["together"] - 0.005
            else "they match about as well"
        )
        where = f"{documents} documents" if documents > 1 else "one document"
        return (
            f"Answered from {len(self.cited)} parts of {where} read together: between them "
            f"they hold {info['together']:.0%} of what the question asks about ({held}); "
            f"{why}."
        )

    def pmi_of(self, part_id: str) -> float | None:
        """The model's score of a candidate (nats), when the model checked it."""
        rerank = self.extra.get("rerank")
        if rerank is None:
            return None
        return next((float(x["pmi"]) for x in rerank["scores"] if x["part_id"] == part_id), None)

    @property
    def checked(self) -> str:
        """ "checked 5 parts in 180 ms" when the model checked the candidates, else ""."""
        rerank = self.extra.get("rerank")
        if rerank is None:
            return ""
        n = rerank["checked"]
        return f"checked {n} part{'s' if n != 1 else ''} in {rerank['ms']:.0f} ms"

    def _explain_reranked(self, best: Candidate, rerank: dict[str, Any]) -> str:
        checked = f"the model {self.checked}"
        if not self.confident:
            return f"Not answered: {self.reason} ({checked})."
        lead = (
            "no other document was a candidate"
            if self.margin == float("inf")
            else "clearly better than any other document"
        )
        also = "".join(
            f"; part {c.part_no} of the same document explains it almost as well and is cited too"
            for c in self.cited[1:]
        )
        return (
            f"Answered from part {best.part_no} of {best.n_parts}: the model finds it explains "
            f"the question, {lead} ({checked}){also}."
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "why": self.explain(),
            "terms": self.question_terms,
            "candidates": [asdict(c) for c in self.candidates],
            "best_score": self.best_score,
            "strength": self.strength,
            "margin": self.margin if self.margin != float("inf") else None,
            "confident": self.confident,
            "cited": [c.part_id for c in self.cited],
            "reason": self.reason,
            "scope": self.scope,
            "method": self.method,
            "rerank": self.extra.get("rerank"),
            "across": self.extra.get("across"),
        }


# Chinese, Japanese and Korean scripts: no spaces between words (or particles glued to them),
# so a run of them is indexed and searched as overlapping character pairs, the usual way to
# search CJK text without a dictionary.
_CJK = re.compile(
    "([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\u1100-\u11ff]+)"
)


def _raw_words(text: str) -> list[str]:
    """Lower-case words; CJK runs as overlapping character pairs (a lone character as itself)."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if not _CJK.search(word):
            out.append(word)
            continue
        for piece in _CJK.split(word):
            if not piece:
                continue
            if not _CJK.fullmatch(piece) or len(piece) == 1:
                out.append(piece)
            else:
                out.extend(piece[i : i + 2] for i in range(len(piece) - 1))
    return out


_STEMMER = snowballstemmer.stemmer("english")
_LATIN = re.compile("[a-z]+")


@functools.lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    """A word's stem (Snowball, English) so "threads" finds "thread" and "refused" finds
    "refuse"; other scripts, numbers and identifiers with digits or underscores as they are."""
    if len(word) < 4 or not _LATIN.fullmatch(word):
        return word
    return str(_STEMMER.stemWord(word))


def words_of(text: str) -> list[str]:
    """The words the index holds: lower-case, stemmed, CJK as character pairs."""
    return [stem(w) for w in _raw_words(text)]


def _is_cjk(word: str) -> bool:
    return bool(_CJK.fullmatch(word))


_HIRAGANA = re.compile("[\u3040-\u309f]+")
# Question words and endings of Chinese and Korean questions (Japanese ones are kana pairs,
# dropped below): what kind of question it is, not what it is about.
CJK_STOPWORDS = frozenset(
    """什么 么是 是什 哪里 哪儿 哪个 是哪 是谁 多少 怎么 为什 什么 吗 呢 的 是 了 在
    어디 무엇 입니 니까 니다 인가 가요 습니 세요 까요 합니 나요 엇입 디에 에있 있나 는무
    누구 언제 얼마 몇 디입 제입 구입""".split()
)


def _asks_nothing(word: str) -> bool:
    """A pair that only says how the question is phrased: kana particles and endings
    (は, の, ですか, どこ…), Chinese and Korean question words."""
    return bool(_HIRAGANA.fullmatch(word)) or word in CJK_STOPWORDS


def query_terms(question: str) -> list[str]:
    seen: list[str] = []
    for word in _raw_words(question):
        if word in STOPWORDS or _asks_nothing(word):
            continue
        if len(word) > 1 or word.isdigit() or _is_cjk(word):
            term = stem(word)
            if term not in seen:
                seen.append(term)
    return seen


def adjacent_pairs(question: str) -> list[str]:
    words = _raw_words(question)
    pairs: list[str] = []
    for first, second in itertools.pairwise(words):
        if first in STOPWORDS or second in STOPWORDS or _asks_nothing(first + second):
            continue
        if _asks_nothing(first) or _asks_nothing(second):
            continue
        if (len(first) < 2 and not _is_cjk(first)) or (len(second) < 2 and not _is_cjk(second)):
            continue
        pair = f"{stem(first)} {stem(second)}"
        if pair not in pairs:
            pairs.append(pair)
    return pairs


class PartIndex:
    """An in-memory FTS5 index over parts' text (plaintext in RAM only).

    FTS5 finds the parts that contain any of the question's words or adjacent word pairs and
    counts in how many parts each occurs; the score is BM25 with Lucene's always-positive
    IDF, ln(1 + (N - n + 0.5) / (n + 0.5)), because FTS5's own bm25() gives a term found in
    half the parts no weight at all, which leaves a two-part document unroutable.
    """

    K1 = 1.2
    B = 0.75

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("PRAGMA temp_store=MEMORY")  # sorts and temp tables never spill to disk
        self.db.execute(
            "CREATE VIRTUAL TABLE parts USING fts5(body, part_id UNINDEXED, "
            "document_id UNINDEXED, part_no UNINDEXED, n_parts UNINDEXED, "
            "tokenize='unicode61 remove_diacritics 2')"
        )
        self.words: dict[str, str] = {}  # part id -> " w1 w2 ... " for phrase counts

    def add(self, rows: Iterable[tuple[str, str, int, int, str]], title: str = "") -> None:
        """(part_id, document_id, part_no, n_parts, text) rows; `title` is the document's
        name, indexed with each of its parts (a question often names what it is about)."""
        # The body is indexed as our own word list (stemmed; CJK runs already cut into
        # pairs), so FTS5 and the phrase counts below see the same words.
        head = " ".join(words_of(title))
        rows = [
            (
                p,
                d,
                no,
                n,
                f"{head} . {' '.join(words_of(text))}" if head else " ".join(words_of(text)),
            )
            for p, d, no, n, text in rows
        ]
        with self.db:
            self.db.executemany(
                "INSERT INTO parts(part_id, document_id, part_no, n_parts, body) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )
        for part_id, _doc, _no, _n, body in rows:
            self.words[part_id] = f" {body} "

    def remove_document(self, document_id: str) -> None:
        gone = [
            r[0]
            for r in self.db.execute(
                "SELECT part_id FROM parts WHERE document_id = ?", [document_id]
            )
        ]
        with self.db:
            self.db.execute("DELETE FROM parts WHERE document_id = ?", [document_id])
        for part_id in gone:
            self.words.pop(part_id, None)

    def __len__(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM parts").fetchone()[0])

    def count(self, document_id: str | None = None) -> int:
        if document_id is None:
            return len(self)
        row = self.db.execute("SELECT count(*) FROM parts WHERE document_id = ?", [document_id])
        return int(row.fetchone()[0])

    def close(self) -> None:
        self.db.close()
        self.words.clear()

    def _matching(self, phrase: str, document_id: str | None) -> set[str]:
        sql = "SELECT part_id FROM parts WHERE parts MATCH ?"
        args: list[Any] = ['"' + phrase.replace('"', '""') + '"']
        if document_id is not None:
            sql += " AND document_id = ?"
            args.append(document_id)
        return {r[0] for r in self.db.execute(sql, args)}

    def _hits(
        self, question: str, document_id: str | None
    ) -> tuple[list[str], float, list[tuple[float, dict[str, int]]]]:
        """The question's terms, their whole IDF weight, and for each word or adjacent
        word pair its IDF and the parts holding it (with how often)."""
        terms = query_terms(question)
        if not terms:
            raise InputError("The question has no words to look for in the documents.")
        # Words, and adjacent word pairs as phrases: a full name or a term of art scores as
        # itself, not as two common words.
        n = self.count(document_id)
        if n == 0:
            return terms, 0.0, []
        ideal = 0.0
        hits: list[tuple[float, dict[str, int]]] = []
        for phrase in [*terms, *adjacent_pairs(question)]:
            found = self._matching(phrase, document_id)
            idf = math.log(1 + (n - len(found) + 0.5) / (len(found) + 0.5))
            ideal += idf
            needle = f" {phrase} "
            # FTS5 can match across punctuation the word list keeps apart: counted as absent.
            counts = {p: self.words[p].count(needle) for p in found}
            hits.append((idf, {p: tf for p, tf in counts.items() if tf}))
        return terms, ideal, hits

    def coverage(self, question: str, part_ids: Iterable[str], document_id: str | None) -> float:
        """The share of the question's weight that the parts hold between them (each word or
        word pair counted once, in whichever holds it)."""
        wanted = set(part_ids)
        _terms, ideal, hits = self._hits(question, document_id)
        held = sum(idf for idf, found in hits if wanted & found.keys())
        return held / ideal if ideal > 0 else 0.0

    def search(
        self,
        question: str,
        document_id: str | None = None,
        limit: int = 8,
        by_score: bool = False,
    ) -> tuple[list[str], list[Candidate]]:
        """(terms, best candidates first): those holding most of the question first, then
        by BM25; or by BM25 alone (`by_score`, for fusion with another ranking)."""
        terms, ideal, hits = self._hits(question, document_id)
        lengths = {p: w.count(" ") - 1 for p, w in self.words.items()}
        avg = sum(lengths.values()) / max(1, len(lengths))
        scores: dict[str, float] = {}
        covered: dict[str, float] = {}
        for idf, found in hits:
            for part_id, tf in found.items():
                covered[part_id] = covered.get(part_id, 0.0) + idf
                norm = self.K1 * (1 - self.B + self.B * lengths[part_id] / avg)
                scores[part_id] = scores.get(part_id, 0.0) + idf * tf * (self.K1 + 1) / (tf + norm)
        if not scores:
            return terms, []
        # Most of the question first (coordination level), then BM25.
        if by_score:
            best = sorted(scores.items(), key=lambda item: -item[1])[:limit]
        else:
            best = sorted(scores.items(), key=lambda item: (-covered[item[0]], -item[1]))[:limit]
        info = {
            r[0]: r[1:]
            for r in self.db.execute(
                f"SELECT part_id, document_id, part_no, n_parts FROM parts WHERE part_id IN "
                f"({','.join('?' * len(best))})",
                [b[0] for b in best],
            )
        }
        candidates = [
            Candidate(
                pid, info[pid][0], int(info[pid][1]), int(info[pid][2]), score, covered[pid] / ideal
            )
            for pid, score in best
        ]
        return terms, candidates


def decide(
    terms: list[str],
    candidates: list[Candidate],
    min_strength: float,
    min_margin: float,
    scope: str,
) -> RouteDecision:
    """The confidence gate: answer only from a clear, strong best match.

    Strength is the share of the question's weight (IDF of its words and word pairs) the
    best part holds, so one threshold means the same for a two-part document and for a
    library of thousands of parts. The margin compares it with the best part of *another*
    document: parts of the same document are neighbours, and two of them holding the words
    is no doubt about where the answer is. A neighbour about as strong as the best part is
    cited with it; the answer comes from the stronger."""
    if not candidates:
        return RouteDecision(terms, [], 0.0, 0.0, False, "no part matches any word", scope)
    first = candidates[0]
    best = first.score
    strength = first.coverage
    rival = next((c for c in candidates[1:] if c.document_id != first.document_id), None)
    runner_up = rival.coverage if rival is not None else 0.0
    margin = strength / runner_up if runner_up > 0 else float("inf")
    if strength < min_strength:
        reason = (
            f"the best match is weak: part {first.part_no} of {first.n_parts} holds only "
            f"{strength:.0%} of what the question asks about (at least {min_strength:.0%} "
            "is needed)"
        )
        return RouteDecision(terms, candidates, best, margin, False, reason, scope, strength)
    if margin < min_margin:
        reason = (
            f"two documents match about as well ({strength:.0%} and {runner_up:.0%} of what "
            f"the question asks about; the best must hold {min_margin:.2g}× the other's)"
        )
        return RouteDecision(terms, candidates, best, margin, False, reason, scope, strength)
    cited = [first] + [
        c
        for c in candidates[1:3]
        if c.document_id == first.document_id and c.coverage * min_margin >= strength
    ]
    return RouteDecision(terms, candidates, best, margin, True, "", scope, strength, cited=cited)
