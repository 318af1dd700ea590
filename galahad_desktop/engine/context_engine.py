"""One context and everything done to it: evaluate, generate, capture, restore.

ContextEngine is the engine's logic over what llama_api.py declares of a model and a
context; it imports no llama.cpp. `Engine` (engine.py) opens them with llama.cpp; the fast
tier's fake (galahad_dev/fake_engine.py) opens Python stand-ins, so what it tests is this
logic itself. One thread owns an engine (llama.cpp contexts are not thread-safe). `tokens`
mirrors what the context holds in sequence 0; it is the ledger the conversation is built
from, so history is never re-rendered or re-tokenized.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from galahad_desktop.engine import fingerprint as fp
from galahad_desktop.engine import kvstate, stacking
from galahad_desktop.engine.chat_format import (
    GEMMA3_TURNS,
    TemplateNotUnderstood,
    TurnFormat,
    derive_turn_format,
)
from galahad_desktop.engine.decoding import Constraint, Generation, decode_reply, is_tag
from galahad_desktop.engine.llama_api import (
    DIRECT,
    KV_TYPES,
    SEQ_PARTIAL_ONLY,
    TOKEN_ATTR_CONTROL,
    TOKEN_ATTR_USER_DEFINED,
    LoadedContext,
    LoadedModel,
    NativeCalls,
)
from galahad_desktop.engine.markup import MarkupGuard
from galahad_desktop.engine.modelinfo import ModelInfo
from galahad_desktop.engine.protocol import ChatEngine, check_state_fits
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.scoring import Snapshot, log_softmax_at
from galahad_desktop.engine.tool_format import ToolMarkers
from galahad_desktop.engine.turns import Turns
from galahad_desktop.engine.values import (
    GEMMA_SAMPLING,
    GENERIC_SAMPLING,
    EngineConfig,
    Placement,
    RuntimeDetails,
    SamplingDefaults,
    Stacked,
)
from galahad_desktop.errors import InputError, ModelError
from galahad_desktop.jobs import NO_JOB, Job, Progress

# A model under a billion parameters wanders in long replies (Gemma 3 270M wrote for 20 s
# at 1,024 tokens): its longest reply is 256 unless Settings or a conversation say.
SMALL_MODEL_PARAMS = 1_000_000_000
SMALL_MODEL_REPLY = 256
SCRATCH_SEQ = 1  # a second sequence: serializes a range of sequence 0, or holds a state
READ_IN_F16_MIN = 64  # shorter reads from empty run in the q8_0 context itself


@dataclass
class Opened:
    """What a subclass's `_open` returns: the model and context, and where they run."""

    model: LoadedModel
    context: LoadedContext
    placement: Placement


class ContextEngine(ABC):
    """The engine's logic. A subclass opens the model and context (`_open`) and says which
    runtime it is (`_runtime`); everything else is here, for the real engine and the fake."""

    model: LoadedModel
    context: LoadedContext

    def __init__(self, config: EngineConfig, hash_cache: Path | None = None) -> None:
        if config.kv_type not in KV_TYPES:
            raise InputError(f"Unknown KV cache type '{config.kv_type}'.")
        self.config = config
        self._window_state: ctypes.Array[ctypes.c_uint8] | None = None  # see _window_buffer
        self.calls: NativeCalls = DIRECT  # _open may put the model on a thread of its own
        self.decoded_tokens = 0  # counted at the decode call itself (`_counted`)
        opened = self._open(config)
        self.model, self.context, self.placement = opened.model, opened.context, opened.placement
        self.gpu_layers = self.placement.gpu_layers
        self.n_vocab = self.model.facts.n_vocab
        self.n_ctx = self.context.n_ctx()
        self.model_sha256 = self._model_sha256(hash_cache)
        user_defined, markup = self._markup_tokens()
        self.guard = MarkupGuard([self._special_text(t) for t in user_defined])
        self.turn_format = self._turn_format()
        self.turns = Turns(self, self.turn_format)
        # Gemma 4's tool markers by id (None: the vocabulary has no tool syntax, Gemma 3).
        self.tool_markers = ToolMarkers.find(
            lambda text: found[0] if len(found := self.encode_template(text)) == 1 else None
        )
        self.stop_rules = self.turns.stop_rules(
            self.is_end_of_generation, markup, self.tool_markers
        )
        self.tokens: list[int] = []
        self.fingerprint_details = self._fingerprint_details()
        self.fingerprint = fp.runtime_fingerprint(self.fingerprint_details.as_dict())
        self.probe_tokens = self.turns.probe
        self._held: int | None = None
        self._resumed_logits: np.ndarray | None = None  # after resume(), until the next eval
        self._logits_stale = False  # a stack that did not read its last token
        self.reads_in_f16 = False  # an engine with an f16 reader sets it (engine.py)

    # -- what a subclass provides
    @abstractmethod
    def _open(self, config: EngineConfig) -> Opened:
        """The model and context this engine runs on."""

    @abstractmethod
    def _runtime(self) -> tuple[str, str]:
        """(library version, what it was built for): part of the runtime fingerprint."""

    def _model_sha256(self, hash_cache: Path | None) -> str:
        return fp.model_sha256(self.config.model_path, hash_cache)

    @abstractmethod
    def model_info(self) -> ModelInfo:
        """What the model file is."""

    def _read_in_f16(self, tokens: Sequence[int], job: Job) -> float:
        raise ModelError("This engine has no f16 reader.")

    @abstractmethod
    def _constraint(self, grammar: str) -> Constraint:
        """The model's grammar sampler for `grammar` (GBNF)."""

    # -- identity ------------------------------------------------------------------------
    def _fingerprint_details(self) -> RuntimeDetails:
        return RuntimeDetails.of(
            self.config,
            self._runtime(),
            self.model_sha256,
            self.n_ctx,
            (self.gpu_layers, self.placement.device if self.gpu_layers else "CPU"),
            self.turn_format,
            attn_rot_disabled=self.attn_rotation_disabled(),
        )

    def attn_rotation_disabled(self) -> bool:
        return False

    def _special_text(self, token: int) -> str:
        return self.model.detokenize([token], special=True).decode("utf-8", "replace")

    def _turn_format(self) -> TurnFormat:
        template = self.model.metadata.get("tokenizer.chat_template")
        if not template:
            return GEMMA3_TURNS
        bos = self._special_text(self.model.facts.bos)
        eos = self._special_text(self.model.facts.eos)
        try:
            return derive_turn_format(template, bos, eos)
        except TemplateNotUnderstood as exc:
            return dataclasses.replace(
                GEMMA3_TURNS,
                understood=False,
                problem=str(exc),
                source="Gemma 3 turn format (fallback: the model's template was not understood)",
            )

    def _markup_tokens(self) -> tuple[list[int], frozenset[int]]:
        """The user-defined tokens (llama.cpp matches their text inside raw text) and every
        markup token, never shown as reply text: control tokens, and user-defined ones
        written as a tag (`<|channel>`, `<start_of_image>`). Gemma also marks runs of
        whitespace and newlines user-defined: those are text, and stay text. The scan asks
        about every token (a third of a second for Gemma's 262k), so its result is kept for
        the process, per model file (by its SHA-256)."""
        key = self.model_sha256
        if key not in _MARKUP_SCANS:
            _MARKUP_SCANS[key] = self._scan_markup()
        user_defined, markup = _MARKUP_SCANS[key]
        return list(user_defined), markup

    def _scan_markup(self) -> tuple[tuple[int, ...], frozenset[int]]:
        user_defined: list[int] = []
        markup: set[int] = set()
        for token in range(self.n_vocab):
            attr = self.model.token_attr(token)
            if attr & TOKEN_ATTR_CONTROL:
                markup.add(token)
            elif attr & TOKEN_ATTR_USER_DEFINED:
                user_defined.append(token)
                if is_tag(self._special_text(token)):
                    markup.add(token)
        return tuple(user_defined), frozenset(markup)

    def is_end_of_generation(self, token: int) -> bool:
        return self.model.is_end_of_generation(token)

    @property
    def backend(self) -> str:
        return self.placement.backend

    def sampling_defaults(self) -> SamplingDefaults:
        """The publisher's recommended sampling: the GGUF's general.sampling.* keys, else
        Gemma's published defaults for a Gemma model."""
        meta = self.model.metadata
        arch = str(meta.get("general.architecture", ""))
        out = GEMMA_SAMPLING if arch.startswith("gemma") else GENERIC_SAMPLING
        published: dict[str, Any] = {}
        for key, name, kind in (
            ("general.sampling.temp", "temperature", float),
            ("general.sampling.top_k", "top_k", int),
            ("general.sampling.top_p", "top_p", float),
        ):
            raw = meta.get(key)
            if raw is not None:
                with contextlib.suppress(ValueError):  # not a number: the default stands
                    published[name] = kind(float(raw))
        if self.model.facts.n_params < SMALL_MODEL_PARAMS:
            published["max_tokens"] = SMALL_MODEL_REPLY
        return dataclasses.replace(out, **published)

    # -- tokens --------------------------------------------------------------------------
    def encode_template(self, text: str) -> list[int]:
        """Tokenize template text: turn markers like <|turn> are honoured."""
        return self.model.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def encode_text(self, text: str) -> list[int]:
        """Tokenize user or document text: no markup token can come out of it (markers a
        user typed stay characters)."""
        return self.guard.tokenize(
            text,
            lambda piece: self.model.tokenize(piece.encode("utf-8"), add_bos=False, special=False),
        )

    def bos(self) -> list[int]:
        return [self.model.facts.bos]

    def model_close(self) -> list[int]:
        return list(self.turns.model_close)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.model.detokenize(tokens).decode("utf-8", "replace")

    # -- evaluation ----------------------------------------------------------------------
    def reset(self, wipe: bool = True) -> None:
        """Empty the context. `wipe` also zeroes the KV buffers (lock uses it to drop
        decrypted state); a restore skips it: masked cells contribute exact zeros."""
        self.context.clear(wipe)
        if wipe:
            self._wipe_window_buffer()
        self._resumed_logits = None
        self._logits_stale = False
        self.tokens = []
        self._held = None

    def room(self) -> int:
        return self.n_ctx - len(self.tokens)

    def _check_room(self, tokens: Sequence[int]) -> None:
        if len(tokens) > self.room():
            raise InputError(
                f"That needs {len(tokens)} more tokens but only {self.room()} of the "
                f"{self.n_ctx}-token context are left."
            )

    def evaluate(self, tokens: Sequence[int], job: Job = NO_JOB) -> float:
        """Evaluate tokens after what the context holds, in n_batch slices, reporting progress
        to `job` and stopping when it is cancelled; return ms."""
        self._check_room(tokens)
        self._resumed_logits = None
        self._logits_stale = False
        if self.reads_in_f16 and not self.tokens and len(tokens) >= READ_IN_F16_MIN:
            return self._read_in_f16(tokens, job)
        start = time.perf_counter()
        step = self.config.n_batch
        for offset in range(0, len(tokens), step):
            job.check()
            piece = list(tokens[offset : offset + step])
            self.context.decode(piece, len(self.tokens))
            self.tokens.extend(piece)
            job.progress(Progress(offset + len(piece), len(tokens), time.perf_counter() - start))
        return (time.perf_counter() - start) * 1e3

    def last_logits(self) -> np.ndarray:
        if self._logits_stale:
            raise ModelError("No logits yet: a stacked block's last token was not read.")
        if self._resumed_logits is not None:
            return self._resumed_logits.copy()
        return self.context.logits(1, self.n_vocab)

    def score(self, tokens: Sequence[int], job: Job = NO_JOB) -> tuple[np.ndarray, float]:
        """Evaluate tokens after what the context holds (as evaluate() does) and return each
        one's log-probability given everything before it, with ms. The first token's comes
        from the logits the context already has, so the context must hold something."""
        if not self.tokens:
            raise ModelError("Nothing to score against: the context is empty.")
        self._check_room(tokens)
        start = time.perf_counter()
        out = np.zeros(len(tokens), dtype=np.float64)
        if not tokens:
            return out, 0.0
        out[0] = log_softmax_at(self.last_logits()[None, :], tokens[:1])[0]
        self._resumed_logits = None
        self._logits_stale = False
        step = self.config.n_batch
        for offset in range(0, len(tokens), step):
            job.check()
            piece = [int(t) for t in tokens[offset : offset + step]]
            self.context.decode(piece, len(self.tokens), logits_all=True)
            self.tokens.extend(piece)
            following = list(tokens[offset + 1 : offset + len(piece) + 1])
            if following:
                rows = self.context.logits(len(piece), self.n_vocab)
                out[offset + 1 : offset + 1 + len(following)] = log_softmax_at(
                    rows[: len(following)], following
                )
        return out, (time.perf_counter() - start) * 1e3

    def snapshot(self) -> Snapshot:
        """The context as it is now, in memory (to resume() from later)."""
        state, size, _ms = self.capture()
        return Snapshot(state, size, list(self.tokens), self.last_logits())

    def resume(self, snapshot: Snapshot) -> float:
        """Put the context back to a snapshot exactly (nothing re-read); returns ms."""
        elapsed = self.restore(snapshot.state, snapshot.tokens, snapshot.size)
        self._resumed_logits = snapshot.logits.copy()
        self._logits_stale = False
        return elapsed

    def generate(self, params: SamplingParams, job: Job = NO_JOB) -> Generation:
        """Sample a reply (decoding.decode_reply: the stop rules, the thought channel, the
        grammar the parameters name)."""
        constraint = self._constraint(params.grammar) if params.grammar else None
        return decode_reply(self, self.stop_rules, params, job, constraint=constraint)

    # -- what decode_reply needs of the model
    def accept(self, token: int) -> None:
        self.context.decode([token], len(self.tokens))
        self._resumed_logits = None
        self._logits_stale = False
        self.tokens.append(token)

    def token_bytes(self, token: int) -> bytes:
        return self.model.detokenize([token])

    # -- a held state, to return to after a thinking turn -------------------------------
    def hold(self) -> None:
        """Remember what the context holds now, so the turn can be re-read from here: its
        cells are shared into the scratch sequence (no copy in a unified cache), which
        keeps them even where the sliding window would let them go."""
        self.context.seq_remove(SCRATCH_SEQ)
        self.context.seq_copy(0, SCRATCH_SEQ)
        self._held = len(self.tokens)

    def return_to_hold(self) -> int:
        """Put the context back exactly as it was at hold() (never by trimming: the sliding
        window cannot roll back); returns how many tokens were dropped."""
        if self._held is None:
            raise ModelError("No held state to return to.")
        self.context.seq_remove(0)
        self.context.seq_copy(SCRATCH_SEQ, 0)
        self.context.seq_remove(SCRATCH_SEQ)
        dropped = len(self.tokens) - self._held
        self.tokens = self.tokens[: self._held]
        self._held = None
        return dropped

    def release_hold(self) -> None:
        if self._held is not None:
            self.context.seq_remove(SCRATCH_SEQ)
            self._held = None

    # -- state capture / restore ---------------------------------------------------------
    def capture(self) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        """Serialize sequence 0 into one buffer: (buffer, bytes used, ms)."""
        start = time.perf_counter()
        buf, used = self.context.seq_state(0)
        if used == 0:
            raise ModelError("llama.cpp could not serialize the sequence state.")
        return buf, used, (time.perf_counter() - start) * 1e3

    def capture_from(self, start: int) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        """Serialize only the cells at positions >= start (what a chain link holds), in
        O(new tokens): the range is shared into a scratch sequence (no copy in a unified
        cache), that sequence is serialized, and its cells are relabelled as sequence 0."""
        begin = time.perf_counter()
        self.release_hold()
        self.context.seq_copy(0, SCRATCH_SEQ, start)
        try:
            buf, used = self.context.seq_state(SCRATCH_SEQ)
        finally:
            self.context.seq_remove(SCRATCH_SEQ)
        if used == 0:
            raise ModelError("llama.cpp could not serialize the new cells.")
        kvstate.relabel(buf, used, SCRATCH_SEQ)
        return buf, used, (time.perf_counter() - begin) * 1e3

    def regraft_window(self) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        """Re-graft the sliding-window cache from its own capture, in place (O(window)):
        the live context then holds exactly the cells a restore rebuilds (with swa_full it
        otherwise keeps cells beyond the window that a saved state does not carry). Returns
        the window's state: its layout is the chain link's."""
        begin = time.perf_counter()
        buf, used = self.context.seq_state(0, SEQ_PARTIAL_ONLY, self._window_buffer)
        if used == 0 or not self.context.set_seq_state(buf, used, 0, SEQ_PARTIAL_ONLY):
            self.reset()
            raise ModelError("llama.cpp could not re-graft the sliding-window cache.")
        return buf, used, (time.perf_counter() - begin) * 1e3

    def _window_buffer(self, size: int) -> ctypes.Array[ctypes.c_uint8]:
        """The window's state is re-grafted after every turn: one buffer, reused (a fresh one
        of 839 MB at Gemma 4 31B's shape cost 400 ms in page faults, the copies 120 ms).
        Its contents are the caller's until the next re-graft; wiped on reset(wipe=True)."""
        buffer = self._window_state
        if buffer is None or ctypes.sizeof(buffer) < size:
            # Grown in steps while the window fills, not at every turn.
            grown = max(size, 2 * ctypes.sizeof(buffer)) if buffer is not None else size
            self._wipe_window_buffer()
            buffer = self._window_state = (ctypes.c_uint8 * grown)()
        return buffer

    def _wipe_window_buffer(self) -> None:
        if self._window_state is not None:
            ctypes.memset(self._window_state, 0, ctypes.sizeof(self._window_state))
            self._window_state = None

    def restore(
        self, payload: ctypes.Array[ctypes.c_uint8], tokens: list[int], size: int | None = None
    ) -> float:
        """Graft a captured state at its own positions into a cleared context; return ms."""
        check_state_fits(len(tokens), self.n_ctx)
        start = time.perf_counter()
        self.reset(wipe=False)  # puts the cell cursor back at 0, as in a fresh context
        size = ctypes.sizeof(payload) if size is None else size
        if not self.context.set_seq_state(payload, size):
            self.reset()
            raise ModelError("llama.cpp refused the stored state (layout does not match).")
        self.tokens = list(tokens)
        return (time.perf_counter() - start) * 1e3

    # -- a stored block at later positions ------------------------------------------------
    def rope_specs(self) -> list[stacking.RopeSpec] | None:
        """Each cache section's rotary parameters (None: the keys carry no rotation)."""
        return None

    def sliding_window(self) -> int:
        arch = self.model.metadata.get("general.architecture", "")
        value = self.model.metadata.get(f"{arch}.attention.sliding_window", "0")
        return int(float(value or 0))

    def stack(
        self,
        payload: ctypes.Array[ctypes.c_uint8],
        size: int,
        block_tokens: Sequence[int],
        skip: int,
        recompute: int,
        job: Job = NO_JOB,
        lead: Sequence[int] = (),
        read_last: bool = True,
    ) -> Stacked:
        """Put a stored block (read alone, from position 0) after what the context holds,
        without reading it again. The context must end with the block's first `skip` tokens
        (the turn opening it already holds) once `lead` (the end of that opening, when the
        context does not hold it yet) is read; `lead` and the block's next `recompute` are
        read on top of the context in one step (each block otherwise starts with a false
        attention sink), and the rest are moved into place from the stored cells, their
        keys re-rotated (stacking.py). With `read_last` the block's last token is read
        too, so that the next token's logits are real; without it the caller reads
        something next (a turn opening, a question) and a step is saved."""
        placed = list(block_tokens[skip:])
        self._check_room([*lead, *placed])
        start = time.perf_counter()
        kept_back = 1 if read_last else 0  # the last token, read after the move
        recompute = max(0, min(recompute, len(placed) - kept_back))
        read = [*lead, *placed[:recompute]]
        recompute_ms = self.evaluate(read, job) if read else 0.0
        job.check()
        delta = len(self.tokens) - skip - recompute
        base_buffer, base_size, _ms = self.capture()
        base = kvstate.parse(base_buffer, base_size)
        block = kvstate.parse(payload, size)
        window = self.sliding_window()
        windows = [0, window] if len(base.sections) == 2 else [0]
        stop = skip + len(placed) - kept_back
        state = stacking.stack_state(
            base, block, skip + recompute, stop, delta, self.rope_specs(), windows
        )
        del base, block
        out, used = kvstate.write(state)
        del state
        ctypes.memset(base_buffer, 0, ctypes.sizeof(base_buffer))
        tokens = self.tokens + placed[recompute : len(placed) - kept_back]
        self.restore(out, tokens, used)
        ctypes.memset(out, 0, ctypes.sizeof(out))
        if read_last:
            recompute_ms += self.evaluate(placed[-1:], job)
        else:
            self._logits_stale = True
        return Stacked(
            len(placed), recompute + kept_back, recompute_ms, (time.perf_counter() - start) * 1e3
        )

    def _counted(self, n: int) -> None:
        self.decoded_tokens += n

    def close(self) -> None:
        self._wipe_window_buffer()
        self.context.close()
        self.model.close()


# Model file (by SHA-256) -> its user-defined and markup tokens (ContextEngine._markup_tokens).
_MARKUP_SCANS: dict[str, tuple[tuple[int, ...], frozenset[int]]] = {}


def _engines_conform(engine: ContextEngine) -> ChatEngine:
    return engine  # mypy checks the structural match here
