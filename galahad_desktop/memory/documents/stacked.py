"""How close a stacked context is to a full read of the same tokens (the `verify` of a
stack, and what `bench stack` measures): greedy next-token distributions on a probe, from
the stacked state and from a fresh read, compared token by token."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterable, Sequence

import numpy as np

from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.engine.values import Counters, Stacked
from galahad_desktop.errors import IntegrityError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.results import StackQuality

# Each stacked block's first tokens read on top of what precedes it (EPIC's k), chosen from
# `bench stack` (docs/performance.md): on Gemma 3 270M at 3 x 1k, 3 x 3k and 5 x 3k tokens,
# KL against a full read averaged 0.101 with none, 0.072 with 4, 0.063 with 8 and 0.080
# with 16 (one run each: 4, 8 and 16 are within the runs' spread); 4 is the smallest k that
# buys the gain and the one that keeps time to first token under 1/20 of a full read at
# 3 x 1k (22.9x; 16: 17.7x). Each block's own <bos> is never stitched in (the naive
# stitch: KL 0.087-0.173).
STACK_RECOMPUTE = 4
QUALITY_PROBE = "In two sentences, what do these documents say?"
QUALITY_PROBE_TOKENS = 32


def stack_stored_block(
    live: LiveContext,
    block_id: str,
    owner_id: str,
    lead: Sequence[int],
    job: Job,
    wrong_format: str,
    recompute: int = STACK_RECOMPUTE,
    as_stored: bool = False,
) -> Stacked:
    """One stored block placed after what the context holds (the engine's `stack`): its
    state read and authenticated, its opening checked against this runtime's turn format
    (`wrong_format` says otherwise), `lead` and its first `recompute` tokens read in one
    step, its last token moved, not read (what follows gives the next logits). The state's
    buffer is wiped whatever happens. `as_stored` (a measurement: `bench stack`'s naive
    stitch) places the whole block as it was stored, its own <bos> and opening included,
    nothing recomputed."""
    engine = live.engine
    opening = engine.bos() + list(engine.probe_tokens)
    stored = live.read_state(block_id, {owner_id})
    try:
        if stored.tokens[: len(opening)] != opening:
            raise IntegrityError(wrong_format)
        return engine.stack(
            stored.payload,
            stored.size,
            stored.tokens,
            0 if as_stored else len(opening),
            0 if as_stored else recompute,
            job,
            lead=lead,
            read_last=False,
        )
    finally:
        live.vault.wipe([stored])


def reread_given_back(
    live: LiveContext, blocks: Iterable[tuple[str, str]], counters: Counters, job: Job
) -> int:
    """Each `(block id, what it is)` whose memory was given back (or captured under another
    runtime) read once, alone, and stored again; the tokens re-read."""
    reread = 0
    for block_id, what in blocks:
        block = live.vault.records.block(block_id)
        if block is None:
            raise IntegrityError(f"{what}'s block is missing from the catalog.")
        if not live.graftable(block_id):
            report = live.reread(block, "its memory was given back", counters, job)
            reread += report.recomputed_tokens
    return reread


def distributions(
    engine: ChatEngine, n: int, forced: list[int] | None = None
) -> tuple[np.ndarray, list[int]]:
    """The next-token distributions of `n` steps from what the context holds, each step
    taking its argmax (or `forced`'s token), and the tokens taken."""
    rows: list[np.ndarray] = []
    taken: list[int] = []
    for step in range(n):
        logits = engine.last_logits().astype(np.float64)
        p = np.exp(logits - logits.max())
        rows.append(p / p.sum())
        token = forced[step] if forced is not None else int(np.argmax(logits))
        taken.append(token)
        if step + 1 < n:
            engine.evaluate([token])
    return np.array(rows), taken


def kl_rows(reference: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Per-row KL(reference || got) in nats."""
    return np.asarray((reference * (np.log(reference + 1e-30) - np.log(got + 1e-30))).sum(axis=1))


def quality(reference: np.ndarray, got: np.ndarray, taken: list[int], ms: float) -> StackQuality:
    kl = kl_rows(reference, got)
    agree = int(sum(int(np.argmax(reference[i])) == int(np.argmax(got[i])) for i in range(len(kl))))
    return StackQuality(
        len(taken),
        round(float(kl.mean()), 5),
        round(float(np.percentile(kl, 99)), 5),
        round(float(kl.max()), 5),
        agree,
        round(ms, 1),
    )


def against_full_read(
    engine: ChatEngine, probe: list[int], n: int = QUALITY_PROBE_TOKENS, job: Job = NO_JOB
) -> StackQuality:
    """Read `probe` on the stacked context and follow its greedy path for `n` tokens; read
    the same tokens from scratch and follow the same path; compare. The context holds what
    it held before when this returns (its state is captured first and restored after)."""
    held = list(engine.tokens)
    buffer, size, _ms = engine.capture()
    try:
        engine.evaluate(probe, job)
        got, taken = distributions(engine, n)
        start = time.perf_counter()
        engine.reset()
        engine.evaluate(held + probe, job)
        reference, _ = distributions(engine, n, taken)
        full_ms = (time.perf_counter() - start) * 1e3
    finally:
        engine.restore(buffer, held, size)
        ctypes.memset(buffer, 0, ctypes.sizeof(buffer))
    return quality(reference, got, taken, full_ms)
