"""The reply loop, once: sample, stop, split the thought channel, stream.

Both engines run this: the llama.cpp session (engine.py) and the fast tier's fake
(galahad_dev/fake_engine.py) supply only the model calls (the logits, evaluating a token, a
token's bytes), so the stop rules the tests check are the ones users get. It imports no
llama.cpp.

Stop rules: an end-of-generation token ends the reply; so does any markup token that opens
or closes a turn (a reply that starts a new turn has ended its own, and the rest would be the
model playing the user). Other markup tokens (an image marker, an unused control token) are
evaluated, as the model chose them, but never shown as text. The thought channel's markers
switch the stream between the answer and the thoughts.
"""

from __future__ import annotations

import codecs
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from galahad_desktop.engine.sampling import Sampler, SamplingParams
from galahad_desktop.errors import DeviceLostError
from galahad_desktop.jobs import Job

StopReason = Literal["end", "length", "cancelled", "context_full", "stop_text", "device_lost"]
STOP_REASONS: tuple[StopReason, ...] = (
    "end",
    "length",
    "cancelled",
    "context_full",
    "stop_text",
    "device_lost",
)


@dataclass
class Generation:
    tokens: list[int]  # everything sampled (thoughts included), in order
    text: str  # the answer shown to the user
    stop_reason: StopReason
    elapsed_ms: float
    tokens_per_s: float = field(default=0.0)
    answer_tokens: list[int] = field(default_factory=list)  # without the thought channel
    thought: str = ""  # the thought channel's text (never part of the answer)
    seed: int = 0  # the seed the sampler ran with (a reply can be reproduced with it)
    problem: str = ""  # why the reply was cut (device_lost: what llama.cpp said)

    @property
    def thought_tokens(self) -> int:
        return len(self.tokens) - len(self.answer_tokens)

    def check_device(self) -> Generation:
        """For callers that store nothing of a cut reply: a lost device server is an error."""
        if self.stop_reason == "device_lost":
            raise DeviceLostError(self.problem)
        return self


@dataclass(frozen=True)
class StopRules:
    """Which tokens end a reply, which are never shown, and the thought channel's markers."""

    end_of_generation: Callable[[int], bool]
    turn_markers: frozenset[int]  # markup that opens or closes a turn: the reply has ended
    hidden: frozenset[int]  # markup never shown as text (control and user-defined tokens)
    thought_open: int | None = None
    thought_close: int | None = None
    reserve: int = 0  # context left free to close the turn and open the next one
    call_open: int | None = None  # a tool call's markers: its text is not the answer
    call_close: int | None = None

    def ends_reply(self, token: int) -> bool:
        return token in self.turn_markers or self.end_of_generation(token)


def is_tag(text: str) -> bool:
    """Whether a token's text is written as markup (`<|turn>`, `<start_of_image>`,
    `<unused12>`), as opposed to text a tokenizer keeps whole (newlines, runs of spaces)."""
    return len(text) > 2 and text.startswith("<") and text.endswith(">") and not text.isspace()


def turn_markers(
    template_pieces: Sequence[Sequence[int]], markup: frozenset[int]
) -> frozenset[int]:
    """The markup tokens found in a turn format's pieces (user and model openings and
    closings): `<start_of_turn>`/`<end_of_turn>` on Gemma 3, `<|turn>`/`<turn|>` on Gemma 4."""
    return frozenset(t for piece in template_pieces for t in piece if t in markup)


class Decoder(Protocol):
    """What the loop needs of a model: the logits now, evaluate one token, its bytes."""

    def last_logits(self) -> np.ndarray: ...
    def accept(self, token: int) -> None: ...
    def token_bytes(self, token: int) -> bytes: ...
    def room(self) -> int: ...


class Constraint(Protocol):
    """A grammar the reply must follow (llama.cpp's grammar sampler on the real engine, the
    same GBNF matched in Python on the fake). Tokens are checked as they are sampled; only
    when the sampled one is refused are the allowed ones found and sampled from (_restrict;
    as llama.cpp's common sampler does: most tokens pass, so a constrained token mostly
    costs one check, not a pass over the vocabulary). End of generation is allowed once the
    grammar is complete, and then only it."""

    def allows(self, token: int) -> bool: ...
    def restrict(self, logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """`logits` with every token but the allowed ones among `ids` at -inf."""
        ...

    def accept(self, token: int) -> None: ...
    def close(self) -> None: ...


class _StopMatcher:
    """How much of one stop text the reply's end holds (Knuth-Morris-Pratt): each
    character of the reply is looked at once, so matching is linear in the reply however
    long the stop text."""

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.held = 0  # the longest prefix of `stop` the text so far ends with
        self.fallback = [0] * len(stop)  # per prefix: its longest proper border
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = self.fallback[k - 1]
            if stop[i] == stop[k]:
                k += 1
            self.fallback[i] = k

    def step(self, char: str) -> bool:
        """Take the reply's next character; True when the stop text has just ended."""
        k, stop = self.held, self.stop
        while k and stop[k] != char:
            k = self.fallback[k - 1]
        if stop[k] == char:
            k += 1
        self.held = k
        return k == len(stop)


class StopTexts:
    """Holds back answer text that may be the start of a stop text, so a stop text is never
    streamed; once one appears, the answer ends just before it."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.matchers = [_StopMatcher(s) for s in self.stops]
        self.pending = ""  # never longer than the longest stop text
        self.hit = False

    def feed(self, piece: str) -> list[str]:
        if not self.stops:
            return [piece]
        if self.hit:
            return []
        text = self.pending + piece
        start = len(self.pending)
        for at in range(start, len(text)):
            ended = [m for m in self.matchers if m.step(text[at])]
            if ended:
                self.hit = True
                self.pending = ""
                shown = text[: at + 1 - max(len(m.stop) for m in ended)]
                return [shown] if shown else []
        keep = max(m.held for m in self.matchers)
        shown, self.pending = text[: len(text) - keep], text[len(text) - keep :]
        return [shown] if shown else []

    def flush(self) -> list[str]:
        """At the end of the reply, held text that never became a stop text is shown."""
        rest, self.pending = self.pending, ""
        return [rest] if rest and not self.hit else []


def fresh_seed() -> int:
    """A seed for one generation: regenerating the same turn gives another reply."""
    return secrets.randbits(32)


def decode_reply(
    model: Decoder,
    rules: StopRules,
    params: SamplingParams,
    job: Job,
    scripted: Iterator[int] | None = None,
    constraint: Constraint | None = None,
) -> Generation:
    """Sample a reply token by token until a stop rule, max_tokens, cancel or a full
    context. The stop token itself is not evaluated: the caller closes the turn with the
    canonical closing tokens. `scripted` tokens (tests) come before sampled ones. The
    pace (tokens so far, tokens/s) goes to `job.pace` as the reply streams. A device server
    lost mid-reply ends it with what was evaluated so far ("device_lost"); the token whose
    evaluation failed was never streamed. `constraint`: a grammar every token must follow
    (scripted ones too); closed here."""
    seed = fresh_seed() if params.seed is None else params.seed
    sampler = Sampler(params, seed)
    stream = _Stream(job, StopTexts(params.stop))
    generated: list[int] = []
    answer: list[int] = []
    stop_reason: StopReason
    problem = ""
    start = time.perf_counter()
    try:
        stop_reason = _sample(
            model, rules, params, job, scripted, sampler, stream, generated, answer, constraint
        )
    except DeviceLostError as lost:
        stop_reason, problem = "device_lost", str(lost)
    finally:
        if constraint is not None:
            constraint.close()
    stream.finish()
    elapsed = time.perf_counter() - start
    return Generation(
        generated,
        "".join(stream.pieces),
        stop_reason,
        elapsed * 1e3,
        len(generated) / elapsed if elapsed > 0 else 0.0,
        answer,
        stream.thought(),
        seed,
        problem,
    )


def _sample(
    model: Decoder,
    rules: StopRules,
    params: SamplingParams,
    job: Job,
    scripted: Iterator[int] | None,
    sampler: Sampler,
    stream: _Stream,
    generated: list[int],
    answer: list[int],
    constraint: Constraint | None = None,
) -> StopReason:
    """The loop itself: fills `generated` and `answer`, returns why it stopped."""
    stop_reason: StopReason = "length"
    start = time.perf_counter()
    in_call = False  # inside a tool call: read back from its tokens, never streamed
    for _ in range(params.max_tokens):
        if job.cancelled:
            stop_reason = "cancelled"
            break
        if model.room() <= rules.reserve:
            stop_reason = "context_full"
            break
        token = next(scripted, None) if scripted is not None else None
        if token is None or constraint is not None:
            logits = model.last_logits()
            token = sampler.sample(logits) if token is None else token
            if constraint is not None and not constraint.allows(token):
                masked = _restrict(constraint, logits, params)
                if not np.isfinite(masked).any():  # nothing may follow: the grammar is stuck
                    stop_reason = "end"
                    break
                token = sampler.sample(masked)
        if rules.ends_reply(token):
            stop_reason = "end"
            break
        if constraint is not None:
            constraint.accept(token)
        model.accept(token)
        generated.append(token)
        elapsed = time.perf_counter() - start
        job.pace(len(generated), len(generated) / elapsed if elapsed > 0 else 0.0)
        if token in (rules.thought_open, rules.thought_close):
            stream.switch(in_thought=token == rules.thought_open)
            continue
        if not stream.in_thought:
            answer.append(token)  # evaluated as the model chose it, shown or not
        if token in (rules.call_open, rules.call_close):
            in_call = token == rules.call_open
        if token in rules.hidden or in_call:
            continue
        stream.feed(model.token_bytes(token))
        if stream.held.hit:
            stop_reason = "stop_text"
            break
    return stop_reason


FIRST_CANDIDATES = 1024


def _restrict(constraint: Constraint, logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The logits the grammar allows. The most likely FIRST_CANDIDATES are checked first,
    and the vocabulary (262,144 tokens on Gemma) only when a token outside them could be
    chosen: never when greedy and one of them is allowed, nor when top_k of them are, nor
    when the most that tokens outside them could weigh leaves the top_p cut where it is.
    The sampler picks from exactly what it would have picked from."""
    greedy = params.temperature <= 0.0
    need = 1 if greedy else max(params.top_k, 1)
    if not 0 < FIRST_CANDIDATES < len(logits) or params.top_k <= 0:
        return constraint.restrict(logits, np.arange(len(logits)))
    ids = np.argpartition(logits, -FIRST_CANDIDATES)[-FIRST_CANDIDATES:]
    masked = constraint.restrict(logits, ids)
    allowed = np.sort(masked[np.isfinite(masked)])[::-1].astype(np.float64)
    if len(allowed) >= need:
        return masked
    if len(allowed) and not greedy and 0.0 < params.top_p < 1.0:
        scaled = allowed / params.temperature
        mass = np.cumsum(np.exp(scaled - scaled[0]))
        # Every token outside weighs at most as much as the least likely one checked.
        floor = float(logits[ids].min()) / params.temperature - scaled[0]
        outside = (need - len(allowed)) * float(np.exp(floor))
        cut_here = int(np.searchsorted(mass / mass[-1], params.top_p)) + 1
        cut_with_outside = int(np.searchsorted(mass / (mass[-1] + outside), params.top_p)) + 1
        if cut_with_outside <= len(allowed) and cut_here == cut_with_outside:
            return masked
    return constraint.restrict(logits, np.arange(len(logits)))


class _Stream:
    """A reply's bytes as text, split between the answer (held back where a stop text may
    begin) and the thought channel, each piece sent to the job as it comes."""

    def __init__(self, job: Job, held: StopTexts) -> None:
        self.job = job
        self.held = held
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pieces: list[str] = []
        self.thoughts: list[str] = []
        self.in_thought = False

    def emit(self, piece: str) -> None:
        if not piece:
            return
        if self.in_thought:
            self.thoughts.append(piece)
            self.job.thought(piece)
            return
        for shown in self.held.feed(piece):
            self.pieces.append(shown)
            self.job.text(shown)

    def feed(self, data: bytes) -> None:
        self.emit(self.decoder.decode(data))

    def switch(self, in_thought: bool) -> None:
        """The thought channel opens or closes: what was decoded so far ends here."""
        self.emit(self.decoder.decode(b"", final=True))
        self.in_thought = in_thought

    def finish(self) -> None:
        self.emit(self.decoder.decode(b"", final=True))
        for shown in self.held.flush():
            self.pieces.append(shown)
            self.job.text(shown)

    def thought(self) -> str:
        thought = "".join(self.thoughts)
        if thought.startswith("thought"):  # the channel's name, not its content
            thought = thought[len("thought") :]
        return thought.strip()
