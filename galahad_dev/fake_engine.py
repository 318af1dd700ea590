"""A deterministic stand-in for the llama.cpp engine, for the fast test tier.

It has the Engine's interface and, where it matters, its behaviour: a byte tokenizer with the
model's markup tokens, an interleaved KV cache (a full-attention section holding every
position and a sliding-window section holding the last WINDOW), states serialized in
llama.cpp's per-sequence layout (so the real parser, splicer and vault run on them), and
logits computed from the cells the context holds — a wrong graft or splice changes them, so
proofs are real checks here too. Nothing is a language model: replies are byte noise.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from galahad_desktop.engine import fingerprint as fp
from galahad_desktop.engine import kvstate
from galahad_desktop.engine.chat_format import GEMMA3_TURNS, GEMMA4_TURNS, TurnFormat
from galahad_desktop.engine.decoding import Generation, decode_reply
from galahad_desktop.engine.markup import MarkupGuard
from galahad_desktop.engine.modelinfo import ModelInfo
from galahad_desktop.engine.protocol import ChatEngine, check_state_fits
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.scoring import Snapshot
from galahad_desktop.engine.turns import Turns
from galahad_desktop.engine.values import (
    GEMMA_SAMPLING,
    EngineConfig,
    Placement,
    RuntimeDetails,
    SamplingDefaults,
)
from galahad_desktop.errors import InputError, ModelError
from galahad_desktop.jobs import NO_JOB, Job, Progress

WINDOW = 32
ROW = 16  # bytes per K (and V) row
BYTES = 256

FLAVOURS: dict[str, tuple[TurnFormat, list[str], list[str]]] = {
    # (turn format, control tokens, user-defined tokens)
    "gemma3": (GEMMA3_TURNS, ["<start_of_turn>", "<end_of_turn>"], ["<start_of_image>"]),
    "gemma4": (GEMMA4_TURNS, ["<|turn>", "<turn|>", "<|think|>"], ["<|channel>", "<channel|>"]),
}


_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}  # specials -> one regex for them


def _row(previous: bytes, token: int, pos: int) -> bytes:
    return hashlib.blake2b(previous + struct.pack("<ii", token, pos), digest_size=ROW).digest()


class FakeEngine:
    def __init__(
        self, config: EngineConfig, hash_cache: Path | None = None, flavour: str = "gemma3"
    ) -> None:
        self.config = config
        self.flavour = flavour
        fmt, controls, user_defined = FLAVOURS[flavour]
        self.specials = ["<bos>", "<eos>", *controls, *user_defined]
        self.ids = {text: BYTES + i for i, text in enumerate(self.specials)}
        self.n_vocab = BYTES + len(self.specials)
        self.n_ctx = config.n_ctx
        self.gpu_layers = 0
        self.placement = Placement("CPU", "CPU", 0, 1, {}, {}, "fake", {}, "a fake engine")
        self.guard = MarkupGuard(user_defined)
        self.turn_format = fmt
        self.turns = Turns(self, fmt)
        markup = frozenset(self.ids[t] for t in self.specials if t != "<bos>")
        self.stop_rules = self.turns.stop_rules(self.is_end_of_generation, markup)
        self.tokens: list[int] = []
        self._full: dict[int, bytes] = {}  # pos -> K row (V is derived)
        self._swa: dict[int, bytes] = {}  # the sliding-window section's cells
        self.model_sha256 = hashlib.sha256(f"fake-{flavour}".encode()).hexdigest()
        self.fingerprint_details = RuntimeDetails.of(
            config, ("fake", "fake"), self.model_sha256, self.n_ctx, (0, "CPU"), fmt
        )
        self.fingerprint = fp.runtime_fingerprint(self.fingerprint_details.as_dict())
        self.probe_tokens = self.turns.probe
        self.decoded_tokens = 0
        self._held: tuple[list[int], dict[int, bytes], dict[int, bytes]] | None = None
        self.script: list[int] = []  # tokens generate() emits before sampling (tests)
        self.closed = False

    # -- identity ------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return "CPU"

    def model_info(self) -> ModelInfo:
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
        )

    def sampling_defaults(self) -> SamplingDefaults:
        return GEMMA_SAMPLING

    def is_end_of_generation(self, token: int) -> bool:
        eog = {"<eos>", "<end_of_turn>", "<turn|>"}
        return token in {self.ids[t] for t in eog if t in self.ids}

    # -- tokens --------------------------------------------------------------------------
    def encode_template(self, text: str) -> list[int]:
        return self._split(text, tuple(self.specials))

    def _plain(self, text: str) -> list[int]:
        """Like llama.cpp with parse_special=False: user-defined markers still match."""
        return self._split(text, tuple(s for s in self.specials if s in self.guard.markers))

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

    def encode_text(self, text: str) -> list[int]:
        return self.guard.tokenize(text, self._plain)

    def bos(self) -> list[int]:
        return [self.ids["<bos>"]]

    def model_close(self) -> list[int]:
        return list(self.turns.model_close)

    def detokenize(self, tokens: Sequence[int]) -> str:
        raw = bytearray()
        for t in tokens:
            if t < BYTES:
                raw.append(t)
            elif self.specials[t - BYTES] in self.guard.markers:
                raw.extend(self.specials[t - BYTES].encode())
        return bytes(raw).decode("utf-8", "replace")

    # -- evaluation ----------------------------------------------------------------------
    def reset(self, wipe: bool = True) -> None:
        self.tokens = []
        self._full = {}
        self._swa = {}
        self._held = None

    def room(self) -> int:
        return self.n_ctx - len(self.tokens)

    def _append(self, token: int) -> None:
        pos = len(self.tokens)
        previous = self._full.get(pos - 1, b"\0" * ROW)
        # A cell depends on the previous cell (which stands for everything before it).
        self._full[pos] = _row(previous, token, pos)
        self._swa[pos] = self._full[pos]
        self._swa.pop(pos - WINDOW, None)
        self.tokens.append(token)
        self.decoded_tokens += 1

    def evaluate(
        self,
        tokens: Sequence[int],
        job: Job = NO_JOB,
    ) -> float:
        if len(tokens) > self.room():
            raise InputError(
                f"That needs {len(tokens)} more tokens but only {self.room()} of the "
                f"{self.n_ctx}-token context are left."
            )
        start = time.perf_counter()
        step = self.config.n_batch
        for offset in range(0, len(tokens), step):
            job.check()
            for token in tokens[offset : offset + step]:
                self._append(int(token))
            piece = min(step, len(tokens) - offset)
            job.progress(Progress(offset + piece, len(tokens), time.perf_counter() - start))
        return (time.perf_counter() - start) * 1e3

    def last_logits(self) -> np.ndarray:
        """A function of every cell held, in both sections: any wrong cell changes them."""
        if not self.tokens:
            return np.zeros(self.n_vocab, dtype=np.float32)
        end = len(self.tokens)
        digest = hashlib.sha256()
        for pos in range(end):
            digest.update(self._full[pos])
        for pos in sorted(self._swa):
            digest.update(struct.pack("<i", pos) + self._swa[pos])
        seed = int.from_bytes(digest.digest()[:8], "little")
        logits = np.random.default_rng(seed).standard_normal(self.n_vocab).astype(np.float32)
        logits[:32] = -30.0  # control bytes: never
        logits[127:BYTES] = -30.0  # non-ASCII bytes: never (readable noise)
        for special in self.specials:
            logits[self.ids[special]] = -30.0
        if end % 23 == 0:  # end the turn now and then
            logits[self.turns.model_close[0]] = 50.0
        return logits

    def score(self, tokens: Sequence[int], job: Job = NO_JOB) -> tuple[np.ndarray, float]:
        """A copy model stands in for the language model: a token continuing three tokens
        seen together anywhere earlier in the context is likely (log p = -1), any other is
        not (-5), so what a part holds makes a question more likely, as with a real model."""
        if not self.tokens:
            raise ModelError("Nothing to score against: the context is empty.")
        seen = {tuple(self.tokens[i : i + 3]) for i in range(len(self.tokens) - 2)}
        out = np.zeros(len(tokens), dtype=np.float64)
        start = time.perf_counter()
        for i, token in enumerate(tokens):
            job.check()
            gram = (*self.tokens[-2:], int(token))
            out[i] = -1.0 if gram in seen else -5.0
            self._append(int(token))
            seen.add(tuple(self.tokens[-3:]))
        return out, (time.perf_counter() - start) * 1e3

    def snapshot(self) -> Snapshot:
        state, size, _ms = self.capture()
        return Snapshot(state, size, list(self.tokens), self.last_logits())

    def resume(self, snapshot: Snapshot) -> float:
        return self.restore(snapshot.state, snapshot.tokens, snapshot.size)

    def generate(
        self,
        params: SamplingParams,
        job: Job = NO_JOB,
    ) -> Generation:
        """The real reply loop (decoding.decode_reply) over the fake's model calls; the
        `script` tokens come first."""
        return decode_reply(self, self.stop_rules, params, job, iter(list(self.script)))

    def accept(self, token: int) -> None:
        self._append(token)

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if token < BYTES else b""

    # -- holding -------------------------------------------------------------------------
    def hold(self) -> None:
        self._held = (list(self.tokens), dict(self._full), dict(self._swa))

    def return_to_hold(self) -> int:
        if self._held is None:
            raise ModelError("No held state to return to.")
        tokens, cells, window = self._held
        dropped = len(self.tokens) - len(tokens)
        self.tokens, self._full, self._swa, self._held = tokens, cells, window, None
        return dropped

    def release_hold(self) -> None:
        self._held = None

    # -- states in llama.cpp's per-sequence layout ----------------------------------------
    def _section(self, positions: list[int], rows: dict[int, bytes]) -> bytes:
        out = bytearray(struct.pack("<II", 1, len(positions)))
        if not positions:
            return bytes(out)
        for pos in positions:
            out += struct.pack("<iIi", pos, 1, 0)
        out += struct.pack("<II", 0, 1)  # row-major V, one layer
        out += struct.pack("<iQ", 1, ROW) + b"".join(rows[p] for p in positions)
        out += struct.pack("<iQ", 1, ROW) + b"".join(rows[p][::-1] for p in positions)
        return bytes(out)

    def _state(self, seq: int, full: list[int], window: list[int] | None) -> bytes:
        body = struct.pack("<Ii", kvstate.STATE_MAGIC, seq) + self._section(full, self._full)
        if window is not None:
            body += self._section(window, self._swa)
        return body

    def _window(self, start: int = 0) -> list[int]:
        return [p for p in sorted(self._swa) if p >= start]

    @staticmethod
    def _buffer(data: bytes) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return buf, len(data), 0.1

    def capture(self) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        return self._buffer(self._state(0, list(range(len(self.tokens))), self._window()))

    def capture_from(self, start: int) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        self.release_hold()
        return self._buffer(
            self._state(0, list(range(start, len(self.tokens))), self._window(start))
        )

    def regraft_window(self) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        data = struct.pack("<Ii", kvstate.STATE_MAGIC, 0) + self._section(self._window(), self._swa)
        return self._buffer(data)

    def restore(
        self, payload: ctypes.Array[ctypes.c_uint8], tokens: list[int], size: int | None = None
    ) -> float:
        check_state_fits(len(tokens), self.n_ctx)
        size = ctypes.sizeof(payload) if size is None else size
        try:
            state = kvstate.parse(payload, size)
        except kvstate.KVLayoutError:
            self.reset()
            raise ModelError(
                "llama.cpp refused the stored state (layout does not match)."
            ) from None
        full = state.sections[0]
        if list(full.pos) != list(range(len(tokens))):
            self.reset()
            raise ModelError("llama.cpp refused the stored state (layout does not match).")
        self.reset()
        self._full = {int(p): bytes(full.layers[0].k[i]) for i, p in enumerate(full.pos)}
        if len(state.sections) > 1 and state.sections[1].n_cells:
            window = state.sections[1]
            self._swa = {int(p): bytes(window.layers[0].k[i]) for i, p in enumerate(window.pos)}
        self.tokens = list(tokens)
        return 0.1

    def close(self) -> None:
        self.closed = True


def fake_factory(flavour: str = "gemma3") -> Callable[[EngineConfig, Path | None], ChatEngine]:
    def factory(config: EngineConfig, hash_cache: Path | None) -> FakeEngine:
        return FakeEngine(config, hash_cache, flavour)

    return factory


def _the_fake_conforms(engine: FakeEngine) -> ChatEngine:
    return engine  # mypy checks the structural match with what the core needs of an engine


__all__ = ["FakeEngine", "fake_factory"]
