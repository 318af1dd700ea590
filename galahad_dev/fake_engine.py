"""A deterministic stand-in for llama.cpp's model and context, for the fast test tier.

FakeEngine is the real engine's logic (engine/context_engine.py) over Python stand-ins for
the two things llama.cpp provides (engine/llama_api.py), as Dangerzone's dummy provider
replaces only the process it spawns. FakeModel is a byte tokenizer with the model's markup
tokens. FakeContext is an interleaved KV cache shared by two sequences (a full-attention
section holding every position and a sliding-window section holding the last WINDOW), whose
states are serialized in llama.cpp's per-sequence layout (so the real parser, splicer and
vault run on them), and whose logits are computed from the cells it holds: a wrong graft or
splice changes them, so proofs are real checks here too. Nothing is a language model:
replies are byte noise, and scoring (a decode with logits for every token) is a copy model.
Imports no llama.cpp.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from galahad_desktop.engine import kvstate
from galahad_desktop.engine.chat_format import GEMMA3_TURNS, GEMMA4_TURNS, TurnFormat
from galahad_desktop.engine.context_engine import SCRATCH_SEQ, ContextEngine, Opened
from galahad_desktop.engine.decoding import Generation, decode_reply
from galahad_desktop.engine.llama_api import (
    SEQ_PARTIAL_ONLY,
    TOKEN_ATTR_CONTROL,
    TOKEN_ATTR_NORMAL,
    TOKEN_ATTR_USER_DEFINED,
    BufferFor,
    ModelFacts,
)
from galahad_desktop.engine.modelinfo import ModelInfo
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.tool_format import MARKER_TEXTS
from galahad_desktop.engine.values import EngineConfig, Placement
from galahad_desktop.jobs import NO_JOB, Job
from galahad_dev.gbnf import Grammar, Matcher, Stack

WINDOW = 32
ROW = 16  # bytes per K (and V) row
BYTES = 256
COPY_BOOST = 5.0  # a continuation seen before: log p near -1 where others are near -6
F16 = 1  # the ggml type the rows are labelled with

FLAVOURS: dict[str, tuple[TurnFormat, list[str], list[str]]] = {
    # (turn format, control tokens, user-defined tokens)
    "gemma3": (GEMMA3_TURNS, ["<start_of_turn>", "<end_of_turn>"], ["<start_of_image>"]),
    "gemma4": (
        GEMMA4_TURNS,
        ["<|turn>", "<turn|>", "<|think|>", "<|tool>", "<tool|>"],
        ["<|channel>", "<channel|>", *MARKER_TEXTS[2:]],  # and the tool call markers
    ),
}
END_OF_GENERATION = ("<eos>", "<end_of_turn>", "<turn|>", "<|tool_response>")

_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}  # specials -> one regex for them


class FakeModel:
    """A byte vocabulary (ids 0-255) and the flavour's specials after it."""

    def __init__(self, flavour: str) -> None:
        _fmt, controls, user_defined = FLAVOURS[flavour]
        self.specials = ["<bos>", "<eos>", *controls, *user_defined]
        self.ids = {text: BYTES + i for i, text in enumerate(self.specials)}
        self.user_defined = frozenset(user_defined)
        self.end_of_turn = self.ids["<end_of_turn>" if flavour == "gemma3" else "<turn|>"]
        self.metadata = {"general.architecture": flavour, "general.name": f"Fake {flavour}"}
        self.facts = ModelFacts(
            n_vocab=BYTES + len(self.specials),
            bos=self.ids["<bos>"],
            eos=self.ids["<eos>"],
            n_layer=1,
            n_params=1,
            n_embd=ROW,
            description="fake model for tests",
        )

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
        """As llama.cpp's: with special=False only user-defined markers still match."""
        specials = [s for s in self.specials if special or s in self.user_defined]
        out = [self.facts.bos] if add_bos else []
        return out + self._split(text.decode("utf-8"), tuple(specials))

    def _split(self, text: str, specials: tuple[str, ...]) -> list[int]:
        """These specials as their ids (the first that matches where several could, as
        llama.cpp's tokenizer does), every other character as its UTF-8 bytes."""
        if not specials:
            return list(text.encode("utf-8"))
        pattern = _PATTERNS.get(specials)
        if pattern is None:
            pattern = _PATTERNS[specials] = re.compile("|".join(map(re.escape, specials)))
        out: list[int] = []
        at = 0
        for found in pattern.finditer(text):
            out.extend(text[at : found.start()].encode("utf-8"))
            out.append(self.ids[found.group()])
            at = found.end()
        out.extend(text[at:].encode("utf-8"))
        return out

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        """As llama.cpp's pieces: control tokens are empty unless `special`."""
        out = bytearray()
        for token in tokens:
            if token < BYTES:
                out.append(token)
            elif special or self.specials[token - BYTES] in self.user_defined:
                out.extend(self.specials[token - BYTES].encode())
        return bytes(out)

    def token_attr(self, token: int) -> int:
        if token < BYTES:
            return TOKEN_ATTR_NORMAL
        if self.specials[token - BYTES] in self.user_defined:
            return TOKEN_ATTR_USER_DEFINED
        return TOKEN_ATTR_CONTROL

    def is_end_of_generation(self, token: int) -> bool:
        return token in {self.ids[t] for t in END_OF_GENERATION if t in self.ids}

    def close(self) -> None:
        pass  # nothing native to free


@dataclass
class _Cell:
    k: bytes  # the K row; V is (token, the K row's tail reversed), so a state carries it
    token: int
    seqs: set[int] = field(default_factory=lambda: {0})

    def v(self) -> bytes:
        return struct.pack("<i", self.token) + self.k[:3:-1]


def _row(previous: bytes, token: int, pos: int) -> bytes:
    """A cell depends on the previous cell (which stands for everything before it)."""
    return hashlib.blake2b(previous + struct.pack("<ii", token, pos), digest_size=ROW).digest()


def _range(start: int, end: int) -> range:
    return range(max(start, 0), end if end >= 0 else 1 << 31)


class FakeContext:
    """Two sections of cells, each keyed by position (the fake keeps one cell per position),
    each cell in a set of sequences; logits computed at each decode, as llama.cpp's are."""

    def __init__(self, model: FakeModel, n_ctx: int, on_decode: Callable[[int], None]) -> None:
        self.model = model
        self._n_ctx = n_ctx
        self._on_decode = on_decode
        self.sections: tuple[dict[int, _Cell], dict[int, _Cell]] = ({}, {})
        self._rows = np.zeros((1, model.facts.n_vocab), dtype=np.float32)

    def n_ctx(self) -> int:
        return self._n_ctx

    def _of(self, seq: int, section: int) -> list[tuple[int, _Cell]]:
        return sorted((p, c) for p, c in self.sections[section].items() if seq in c.seqs)

    def decode(self, tokens: Sequence[int], n_past: int, logits_all: bool = False) -> None:
        self.seq_remove(-1, n_past, -1)
        full, window = self.sections
        for i, token in enumerate(tokens):
            pos = n_past + i
            previous = full.get(pos - 1)
            k = _row(previous.k if previous and 0 in previous.seqs else b"\0" * ROW, token, pos)
            full[pos] = _Cell(k, int(token))
            window[pos] = _Cell(k, int(token))
            gone = window.get(pos - WINDOW)
            if gone is not None:  # out of the window for sequence 0
                gone.seqs.discard(0)
                if not gone.seqs:
                    del window[pos - WINDOW]
        self._rows = self._copy_rows(len(tokens)) if logits_all else self._noise_row()
        self._on_decode(len(tokens))

    def _noise_row(self) -> np.ndarray:
        """A function of every cell sequence 0 holds, in both sections: any wrong cell
        changes it. Readable byte noise, and the end of the turn now and then."""
        full = self._of(0, 0)
        digest = hashlib.sha256()
        for _pos, cell in full:
            digest.update(cell.k)
        for pos, cell in self._of(0, 1):
            digest.update(struct.pack("<i", pos) + cell.k)
        seed = int.from_bytes(digest.digest()[:8], "little")
        logits = np.random.default_rng(seed).standard_normal(self.model.facts.n_vocab)
        logits = logits.astype(np.float32)
        logits[:32] = -30.0  # control bytes: never
        logits[127:] = -30.0  # non-ASCII bytes and markup: never
        if len(full) % 23 == 0:
            logits[self.model.end_of_turn] = 50.0
        return logits[None, :]

    def _copy_rows(self, n: int) -> np.ndarray:
        """For the last n positions: a token continuing three tokens seen together earlier
        in sequence 0 is likely, any other is not (a copy model: what a part holds makes a
        question more likely, as with a real model)."""
        tokens = [cell.token for _pos, cell in self._of(0, 0)]
        follows: dict[tuple[int, int], set[int]] = {}
        first = len(tokens) - n
        for i in range(max(first - 2, 0)):  # the grams ending before the first new token
            follows.setdefault((tokens[i], tokens[i + 1]), set()).add(tokens[i + 2])
        rows = np.zeros((n, self.model.facts.n_vocab), dtype=np.float32)
        for row, at in enumerate(range(first, len(tokens))):
            if at >= 2:  # the gram ending here is now seen
                follows.setdefault((tokens[at - 2], tokens[at - 1]), set()).add(tokens[at])
            if at >= 1:
                for token in follows.get((tokens[at - 1], tokens[at]), ()):
                    rows[row, token] = COPY_BOOST
        return rows

    def logits(self, rows: int, n_vocab: int) -> np.ndarray:
        return self._rows[-1].copy() if rows == 1 else self._rows[:rows].copy()

    def clear(self, wipe: bool) -> None:
        self.sections = ({}, {})

    def seq_remove(self, seq: int, start: int = -1, end: int = -1) -> None:
        span = _range(start, end)
        for section in self.sections:
            for pos in [p for p in section if p in span]:
                cell = section[pos]
                cell.seqs = set() if seq < 0 else cell.seqs - {seq}
                if not cell.seqs:
                    del section[pos]

    def seq_copy(self, source: int, target: int, start: int = -1, end: int = -1) -> None:
        span = _range(start, end)
        for section in self.sections:
            for pos, cell in section.items():
                if pos in span and source in cell.seqs:
                    cell.seqs.add(target)

    def seq_state(
        self, seq: int, flags: int = 0, into: BufferFor | None = None
    ) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
        """llama.cpp's layout: the full section then the window (only the window with
        SEQ_PARTIAL_ONLY), one layer, row-major V."""
        data = bytearray(struct.pack("<Ii", kvstate.STATE_MAGIC, seq))
        for index in (1,) if flags & SEQ_PARTIAL_ONLY else (0, 1):
            cells = self._of(seq, index)
            data += struct.pack("<II", 1, len(cells))
            if not cells:
                continue
            for pos, _cell in cells:
                data += struct.pack("<iIi", pos, 1, seq)
            data += struct.pack("<II", 0, 1)
            data += struct.pack("<iQ", F16, ROW) + b"".join(c.k for _p, c in cells)
            data += struct.pack("<iQ", F16, ROW) + b"".join(c.v() for _p, c in cells)
        if into is None:
            return (ctypes.c_uint8 * len(data)).from_buffer_copy(bytes(data)), len(data)
        buffer = into(len(data))
        ctypes.memmove(buffer, bytes(data), len(data))
        return buffer, len(data)

    def set_seq_state(
        self, state: ctypes.Array[ctypes.c_uint8], size: int, seq: int = 0, flags: int = 0
    ) -> bool:
        """Graft a state into sequence `seq`, replacing what it held there; False (and
        nothing changed) for a state in another layout, as llama.cpp refuses one."""
        try:
            header = struct.unpack_from("<Ii", bytes(state[:8]))
            parsed = kvstate.parse(state, size, seq=header[1])
        except (kvstate.KVLayoutError, struct.error):
            return False
        targets = (1,) if flags & SEQ_PARTIAL_ONLY else (0, 1)
        if len(parsed.sections) != len(targets):
            return False
        for section in parsed.sections:
            if section.n_cells and (
                len(section.layers) != 1 or section.layers[0].k_row != ROW or section.v_trans
            ):
                return False
        for index, section in zip(targets, parsed.sections, strict=True):
            self._drop(seq, index)
            cells = self.sections[index]
            if section.n_cells == 0:
                continue
            layer = section.layers[0]
            for i, pos in enumerate(section.pos):
                token = struct.unpack("<i", bytes(layer.v[i][:4]))[0]
                cells[int(pos)] = _Cell(bytes(layer.k[i]), token, {seq})
        return True

    def _drop(self, seq: int, index: int) -> None:
        section = self.sections[index]
        for pos in list(section):
            section[pos].seqs.discard(seq)
            if not section[pos].seqs:
                del section[pos]

    def close(self) -> None:
        pass  # nothing native to free


class FakeEngine(ContextEngine):
    """The engine's logic on the fake model and context. `script`: tokens generate()
    emits before sampling (tests)."""

    model: FakeModel
    context: FakeContext

    def __init__(
        self, config: EngineConfig, hash_cache: Path | None = None, flavour: str = "gemma3"
    ) -> None:
        self.flavour = flavour
        super().__init__(config, hash_cache)
        self.ids = self.model.ids
        self.specials = self.model.specials
        self.script: list[int] = []

    def _open(self, config: EngineConfig) -> Opened:
        model = FakeModel(self.flavour)
        context = FakeContext(model, config.n_ctx, self._counted)
        placement = Placement("CPU", "CPU", 0, 1, {}, {}, "fake", {}, "a fake engine")
        return Opened(model, context, placement)

    def _runtime(self) -> tuple[str, str]:
        return "fake", "fake"

    def _model_sha256(self, hash_cache: Path | None) -> str:
        return hashlib.sha256(f"fake-{self.flavour}".encode()).hexdigest()

    def _turn_format(self) -> TurnFormat:
        # What the flavour's template derives (tests/test_gemma4.py checks GEMMA4_TURNS
        # against the real Gemma 4 template); the fake has no template to derive it from.
        return FLAVOURS[self.flavour][0]

    def model_info(self) -> ModelInfo:
        # The fake has no model file to describe.
        return ModelInfo(
            str(self.config.model_path),
            f"Fake {self.flavour}",
            self.flavour,
            "fake",
            1,
            1,
            self.n_ctx,
            2,
            self.flavour == "gemma4",
            "F32",
            "chat" if self.flavour == "gemma4" else "demo",
            "fake model for tests",
            window=WINDOW,
        )

    def _constraint(self, grammar: str) -> FakeGrammar:
        return FakeGrammar(self.model, grammar)

    def generate(self, params: SamplingParams, job: Job = NO_JOB) -> Generation:
        """The real reply loop; the `script` tokens come first."""
        constraint = self._constraint(params.grammar) if params.grammar else None
        return decode_reply(self, self.stop_rules, params, job, iter(list(self.script)), constraint)


class FakeGrammar:
    """The same GBNF the real engine gives llama.cpp, matched in Python on the fake's byte
    vocabulary (galahad_dev/gbnf.py): the constraint the one reply loop applies."""

    def __init__(self, model: FakeModel, grammar: str) -> None:
        self.model = model
        self.matcher = Matcher(Grammar.parse(grammar))

    def _after(self, token: int) -> frozenset[Stack]:
        if token >= BYTES:
            text = self.model.specials[token - BYTES]
            return self.matcher.after(
                token, text.encode() if text in self.model.user_defined else None
            )
        return self.matcher.after(token, bytes([token]))

    def allows(self, token: int) -> bool:
        if self.model.is_end_of_generation(token):
            return self.matcher.complete
        return bool(self._after(token))

    def restrict(self, logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
        out = np.full(len(logits), -np.inf, dtype=np.float32)
        for token in ids:
            if self.allows(int(token)):
                out[token] = logits[token]
        return out

    def accept(self, token: int) -> None:
        if not self.model.is_end_of_generation(token):
            self.matcher.stacks = self._after(token)

    def close(self) -> None:
        pass


def fake_factory(flavour: str = "gemma3") -> Callable[[EngineConfig, Path | None], ChatEngine]:
    def factory(config: EngineConfig, hash_cache: Path | None) -> FakeEngine:
        return FakeEngine(config, hash_cache, flavour)

    return factory


__all__ = ["SCRATCH_SEQ", "FakeContext", "FakeEngine", "FakeModel", "fake_factory"]
