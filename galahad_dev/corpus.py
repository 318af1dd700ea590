"""Seeded, locally generated text: prose, code-like lines and tables with random names, dates
and amounts, plus needle records ("<name>'s access code is <4 digits>") and decoys."""

from __future__ import annotations

import random
from dataclasses import dataclass

FIRST = tuple(
    "Ada Bram Cora Dev Elin Faro Gwen Hugo Ines Jory Kael Lira Milo Nora Otto Pia Quin Rhea "
    "Sami Tova Ugo Vera Wren Xavi Yara Zeno Alba Bento Cyra Doran Esme Finn Greta Hale Ivo "
    "Juno Kira Lev Mara Nico Oona Petr Rosa Soren Tamsin Ulla Viggo Wilma".split()
)
LAST = tuple(
    "Abbott Brandt Castell Dunmore Elwood Farrow Garnett Holloway Ingram Jessup Kerrigan "
    "Lindqvist Marlowe Northcott Okafor Pryce Quimby Radcliffe Stroud Thorne Upton Vance "
    "Whitlock Yardley Zeller Ashby Blackwood Crane Delacroix Everhart".split()
)
PLACES = (
    "the harbour office",
    "the north depot",
    "the river archive",
    "the old mill",
    "the glasshouse",
    "the signal tower",
    "the east market",
    "the library annex",
)
VERBS = (
    "inspected",
    "catalogued",
    "repaired",
    "audited",
    "delivered",
    "measured",
    "painted",
    "reviewed",
)
THINGS = (
    "crates of tea",
    "survey maps",
    "brass fittings",
    "ledgers",
    "lamp wicks",
    "bolts of linen",
    "barrels of cider",
    "rope coils",
)


@dataclass(frozen=True)
class Needle:
    name: str
    code: str
    part: int


class Corpus:
    """Names in filler prose come from their own pool (repeats allowed); needle, decoy and
    negative-control names are drawn once each from a disjoint pool, so an "absent" name
    really appears nowhere."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        everyone = [f"{first} {last}" for first in FIRST for last in LAST]
        self.rng.shuffle(everyone)
        self.prose_names = everyone[:240]
        self.unique_names = everyone[240:]

    def name(self) -> str:
        """A name used nowhere else in the corpus."""
        if not self.unique_names:
            raise ValueError("the corpus ran out of distinct names")
        return self.unique_names.pop()

    def absent_name(self) -> str:
        """A name that appears nowhere in the corpus (for negative controls)."""
        return self.name()

    def date(self) -> str:
        return (
            f"{self.rng.randint(1, 28)} {self.rng.choice(['March', 'June', 'October'])} "
            f"{self.rng.randint(1890, 1930)}"
        )

    def prose(self) -> str:
        r = self.rng
        return (
            f"On {self.date()}, {r.choice(self.prose_names)} {r.choice(VERBS)} {r.randint(2, 90)} "
            f"{r.choice(THINGS)} at {r.choice(PLACES)} for {r.randint(3, 900)} crowns."
        )

    def code_line(self) -> str:
        r = self.rng
        return (
            f"    record_{r.randint(100, 999)} = Entry(qty={r.randint(1, 99)}, "
            f"price={r.randint(1, 500)}.{r.randint(0, 99):02d}, site='{r.choice(PLACES)}')"
        )

    def table_row(self) -> str:
        r = self.rng
        return f"| {self.date()} | {r.choice(THINGS)} | {r.randint(1, 999)} | {r.randint(1, 99)}% |"

    def filler(self, approx_words: int) -> list[str]:
        lines: list[str] = []
        words = 0
        while words < approx_words:
            kind = self.rng.random()
            if kind < 0.6:
                line = self.prose()
            elif kind < 0.8:
                line = self.code_line()
            else:
                line = self.table_row()
            lines.append(line)
            words += len(line.split())
        return lines

    def document(
        self, approx_words: int, part: int, needles: int = 1, decoys: int = 2
    ) -> tuple[str, list[Needle]]:
        """A document of about `approx_words` words holding needle and decoy records."""
        lines = self.filler(approx_words)
        planted: list[Needle] = []
        for index in range(needles + decoys):
            name = self.name()
            code = f"{self.rng.randint(1000, 9999)}"
            lines.insert(self.rng.randint(0, len(lines)), f"{name}'s access code is {code}.")
            if index < needles:
                planted.append(Needle(name, code, part))
        return "\n".join(lines), planted
