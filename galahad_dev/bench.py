"""`python -m galahad_dev bench resume|deposit|kv-quality`: our path against plain
llama.cpp, measured side by side in one run (medians of repetitions), with the runtime
fingerprint, like llama-bench. A development tool (it needs a checkout), not the app's.

Absolute times on shared machines drift; the ratios within one run are the result.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from galahad_desktop.engine.engine import Engine
from galahad_desktop.errors import InputError
from galahad_desktop.memory.galahad import Galahad, engine_config
from galahad_desktop.vault.blockfile import CHUNK_BYTES
from galahad_desktop.vault.keys import MemoryKeyStore

Log = Callable[[str], None]


@dataclass(frozen=True)
class Run:
    """Where a measurement runs: the model (None: the embedded one), settings laid over the
    defaults, and where its progress is written."""

    model_path: Path | None
    overrides: dict[str, Any]
    log: Log

    def bench(self, **changes: Any) -> Bench:
        """A throwaway core on this run's model, with `changes` over its settings."""
        return Bench(self.model_path, {**self.overrides, **changes}, self.log)


_WORDS = (
    "the castle road river knight ledger winter harbour lantern orchard market bell tower "
    "bridge mill garden letter archive candle forge meadow chapel quarry ferry signal"
).split()


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def stamp(fingerprint: str | None = None) -> dict[str, Any]:
    """What a result was measured on: the commit, whether the tree had local changes
    beside it, the machine, and the runtime fingerprint (when one engine measured it)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], capture_output=True, text=True, cwd=root, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": machine(),
        "fingerprint": fingerprint,
    }


def context_for(max_tokens: int) -> int:
    return ((max_tokens + 1024) // 256 + 1) * 256


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--sizes must be comma-separated token counts, got '{text}'.") from None
    if not sizes or min(sizes) < 64 or max(sizes) > 262_144:
        raise InputError("--sizes needs token counts between 64 and 262,144.")
    return sizes


def llama_engine(core: Galahad) -> Engine:
    """The core's engine as llama.cpp's session: the benchmarks measure llama.cpp itself."""
    engine = core.engine
    if not isinstance(engine, Engine):
        raise TypeError("the benchmarks need the llama.cpp engine, not a stand-in")
    return engine


def rss_mb() -> float:
    """This process's resident memory now (MB), or its peak where only that is known."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    try:
        import resource

        peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    except ImportError:
        return 0.0
    return maxrss_mb(peak, sys.platform)


def maxrss_mb(ru_maxrss: float, platform: str) -> float:
    """getrusage's peak in MB: macOS counts it in bytes, Linux and the BSDs in KiB."""
    return ru_maxrss / 2**20 if platform == "darwin" else ru_maxrss / 1024


class PeakRss:
    """Samples resident memory in a thread while a block runs: the block's peak."""

    def __init__(self) -> None:
        import threading

        self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_mb())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


class Bench:
    """A throwaway data directory and keystore (benchmarks never touch the user's data)."""

    def __init__(self, model_path: Path | None, overrides: dict[str, Any], log: Log) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="galahad-bench-"))
        self.keystore = MemoryKeyStore()
        self.model_path = model_path
        self.overrides = {"temperature": 0.0, **overrides}  # benchmarks decode greedily
        self.log = log
        self.core = self.open_core()
        self._rng = random.Random(int(overrides.get("seed", 0)) + 1234)

    def open_core(self) -> Galahad:
        return Galahad(
            self.tmp / "data",
            model_path=self.model_path,
            keystore=self.keystore,
            overrides=self.overrides,
        )

    def fresh_engine(self) -> None:
        """A new llama.cpp context (model load untimed): nothing of earlier work in memory."""
        self.core.reload_engine()
        _ = self.core.engine

    def _line(self) -> str:
        words = [self._rng.choice(_WORDS) for _ in range(self._rng.randint(8, 16))]
        number = self._rng.randint(10, 9999)
        return f"{' '.join(words).capitalize()} {number}."

    def text_of_tokens(self, target: int) -> str:
        """Generated text whose document turn is as close to `target` tokens as whole lines
        allow (never above)."""
        docs = self.core.documents

        def count(lines: list[str]) -> int:
            return len(docs.document_tokens("bench.txt", "\n".join(lines)))

        lines: list[str] = []
        while count(lines) <= target:
            lines += [self._line() for _ in range(max(8, target // 16))]
        low, high = 0, len(lines)
        while low < high:
            middle = (low + high + 1) // 2
            if count(lines[:middle]) <= target:
                low = middle
            else:
                high = middle - 1
        return "\n".join(lines[:low])

    def report(self, command: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The envelope every benchmark prints: results with the runtime fingerprint."""
        engine = self.core.engine
        return {
            "command": command,
            "results": rows,
            "fingerprint": engine.fingerprint,
            "fingerprint_details": engine.fingerprint_details.as_dict(),
            "placement": engine.placement.as_dict(),  # the device, offloaded layers, KV's home
            "machine": machine(),
        }

    def close(self) -> None:
        self.core.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def floor_ms(n_bytes: int, tmp: Path) -> float:
    """Read n_bytes of AES-GCM ciphertext from disk and decrypt it into one buffer (the
    least work any encrypted restore must do before llama.cpp copies the state in)."""
    key = AESGCM.generate_key(bit_length=256)
    aead = AESGCM(key)
    path = tmp / "floor.bin"
    nonce = b"\0" * 12
    chunks = []
    with open(path, "wb") as handle:
        remaining = n_bytes
        while remaining > 0:
            size = min(CHUNK_BYTES, remaining)
            ciphertext = aead.encrypt(nonce, os.urandom(size), None)
            handle.write(ciphertext)
            chunks.append(len(ciphertext))
            remaining -= size
    # Warm buffer, like the vault's reused one: first-touch page faults are not decryption.
    buffer = (ctypes.c_uint8 * n_bytes)()
    ctypes.memset(buffer, 1, n_bytes)
    start = time.perf_counter()
    view = memoryview(buffer).cast("B")
    scratch = bytearray(max(chunks))
    offset = 0
    with open(path, "rb") as handle:
        for length in chunks:
            piece = memoryview(scratch)[:length]
            handle.readinto(piece)
            aead.decrypt_into(nonce, piece, None, view[offset : offset + length - 16])
            offset += length - 16
    elapsed = ms_since(start)
    path.unlink()
    return elapsed


def _texts(bench: Bench, sizes: list[int], kv_types: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """Each size under each KV cache type, side by side: the bench's core is switched to
    the type, then (type, a text of that many tokens) is given."""
    for size, kv_type in [(s, k) for s in sizes for k in kv_types]:
        use_kv_type(bench, kv_type)
        yield kv_type, bench.text_of_tokens(size)


def use_kv_type(bench: Bench, kv_type: str) -> None:
    """Switch the bench's core to another KV cache type (a fresh engine)."""
    bench.core.settings.override({"kv_type": kv_type})
    bench.fresh_engine()


def bench_resume(
    sizes: list[int],
    reps: int,
    run: Run,
    kv_types: tuple[str, ...] = ("f16",),
) -> dict[str, Any]:
    """Restore a stored document block into a new context against re-reading it and
    against llama.cpp's plain sequence file, with the floor (read + decrypt); once per KV
    cache type, side by side."""
    log, bench = run.log, run.bench(n_ctx=context_for(max(sizes)))
    rows = []
    try:
        core = bench.core
        for kv_type, text in _texts(bench, sizes, kv_types):
            deposited = core.deposit_text("bench.txt", text)
            row_block = core.vault.block_row(deposited.block_id)
            tokens = core.vault.block_tokens(row_block)
            n = len(tokens)
            log(f"resume: {n:,} tokens, {kv_type} cache")
            prefill, restore, proof_ms, verdicts, seq_load = [], [], [], [], []
            for _ in range(reps):
                bench.fresh_engine()
                start = time.perf_counter()
                core.engine.evaluate(tokens)
                prefill.append(ms_since(start))
            # llama.cpp's own file of the same state (grafted byte-exact), saved once.
            engine = llama_engine(core)
            engine.reset()
            stored = core.vault.read_block(deposited.block_id)
            engine.restore(stored.payload, stored.tokens, stored.size)
            del stored
            seq_path = bench.tmp / "seq.bin"
            seq_save, seq_bytes = engine.save_sequence_file(tokens, seq_path)
            core.vault.lock()  # the first restore below pays for a fresh buffer
            core.vault.unlock()
            owners = {deposited.document_id}
            for rep in range(reps):
                # Each in a new context, in alternating order: neither gets the other's caches.
                for turn in (0, 1) if rep % 2 == 0 else (1, 0):
                    bench.fresh_engine()
                    if turn == 0:
                        restore_ms, _n, result = core.live.restore_and_prove(
                            deposited.block_id, owners
                        )
                        restore.append(restore_ms)
                        proof_ms.append(result.proof_ms)
                        verdicts.append(result.verdict)
                    else:
                        seq_load.append(llama_engine(core).load_sequence_file(n, seq_path))
            seq_path.unlink()
            floors = [floor_ms(row_block["payload_bytes"], bench.tmp) for _ in range(reps)]
            out: dict[str, Any] = {
                "tokens": n,
                "kv_type": kv_type,
                "prefill_ms": median(prefill),
                "restore_ms": median(restore),
                "restore_first_ms": restore[0],
                "proof_ms": median(proof_ms),
                "proof": "exact" if set(verdicts) == {"exact"} else ",".join(sorted(set(verdicts))),
                "floor_ms": median(floors),
                "seq_file_ms": median(seq_load),
                "seq_file_save_ms": seq_save,
                "capture_ms": row_block["capture_ms"],
                "block_bytes": row_block["file_bytes"],
                "seq_file_bytes": seq_bytes,
                "reps": reps,
                "config": config_of(core),
            }
            out["speedup_vs_prefill"] = out["prefill_ms"] / out["restore_ms"]
            out["ratio_to_floor"] = out["restore_ms"] / out["floor_ms"]
            out["ratio_to_seq_file"] = out["restore_ms"] / out["seq_file_ms"]
            out["bytes_per_token"] = out["block_bytes"] / n
            core.forget(deposited.document_id)
            rows.append(out)
        return bench.report("bench resume", rows)
    finally:
        bench.close()


def config_of(core: Galahad) -> dict[str, Any]:
    d = core.engine.fingerprint_details.as_dict()
    keys = ("n_ctx", "n_batch", "n_ubatch", "n_threads", "flash_attn", "swa_full", "kv_type")
    return {k: d[k] for k in keys}


PREVIOUS_DEFAULTS = {"flash_attn": False, "swa_full": True}
BEST_RAW = {"flash_attn": True, "swa_full": False}


def raw_prefill_ms(core: Galahad, tokens: list[int], changes: dict[str, Any]) -> float:
    """Plain llama.cpp (the same token ids through llama_decode in n_batch slices) under
    another configuration, in a context of its own."""
    config = replace(engine_config(core.settings, core.model_path), **changes)
    engine = Engine(config)
    try:
        warm_up(engine, tokens)
        start = time.perf_counter()
        for offset in range(0, len(tokens), config.n_batch):
            piece = tokens[offset : offset + config.n_batch]
            engine.context.decode(piece, len(engine.tokens))
            engine.tokens.extend(piece)
        return ms_since(start)
    finally:
        engine.close()


def warm_up(engine: Engine, tokens: list[int]) -> None:
    """One small batch first: graph allocation and first-touch pages are not reading."""
    engine.evaluate(tokens[:32])
    engine.reset()


def bench_deposit(
    sizes: list[int],
    reps: int,
    run: Run,
    kv_types: tuple[str, ...] = ("f16",),
) -> dict[str, Any]:
    """A deposit (read, capture, encrypt, write) against plain llama.cpp reading the same
    tokens with an f16 cache (the previous defaults, and its fastest configuration here) and
    with the row's cache type; then an ask on the deposited block, whose proof must be
    exact, and a reply decoded on it (tokens/s). Once per KV cache type, side by side."""
    log, bench = run.log, run.bench(n_ctx=context_for(max(sizes)))
    rows = []
    try:
        core = bench.core
        for kv_type, text in _texts(bench, sizes, kv_types):
            tokens = core.documents.document_tokens("bench.txt", text)
            default, best, native, deposit, peaks, decode = [], [], [], [], [], []
            verdicts = []
            for _ in range(reps):
                default.append(
                    raw_prefill_ms(core, tokens, {**PREVIOUS_DEFAULTS, "kv_type": "f16"})
                )
                best.append(raw_prefill_ms(core, tokens, {**BEST_RAW, "kv_type": "f16"}))
                native.append(raw_prefill_ms(core, tokens, {**BEST_RAW, "kv_type": kv_type}))
                core.reload_engine()
                warm_up(llama_engine(core), tokens)
                with PeakRss() as peak:
                    start = time.perf_counter()
                    deposited = core.deposit_text("bench.txt", text)
                    deposit.append(ms_since(start))
                peaks.append(peak.peak)
                conversation = core.new_conversation(document_id=deposited.document_id)
                core.reload_engine()  # the ask grafts from disk into a new context
                turn = core.send(
                    conversation,
                    "What is the first line about?",
                    params=core.sampling(max_tokens=4, temperature=0.0),
                )
                verdicts.append(turn.proof.verdict)
                reply = core.send(
                    conversation,
                    "Now write a long story about it.",
                    params=core.sampling(max_tokens=64, temperature=0.0),
                )
                decode.append(reply.tokens_per_s)
                core.forget(deposited.document_id)
            log(f"deposit: {len(tokens):,} tokens, {kv_type} cache")
            row: dict[str, Any] = {
                "tokens": len(tokens),
                "kv_type": kv_type,
                "raw_prefill_default_ms": median(default),
                "raw_prefill_best_ms": median(best),
                "raw_prefill_same_kv_ms": median(native),
                "deposit_ms": median(deposit),
                "decode_tokens_per_s": median(decode),
                "peak_rss_mb": max(peaks),
                "config": config_of(core),
                "ask_proof": "exact"
                if set(verdicts) == {"exact"}
                else ",".join(sorted(set(verdicts))),
                "reps": reps,
            }
            row["deposit_over_best"] = row["deposit_ms"] / row["raw_prefill_best_ms"]
            row["speedup_vs_default"] = row["raw_prefill_default_ms"] / row["deposit_ms"]
            rows.append(row)
        return bench.report("bench deposit", rows)
    finally:
        bench.close()


QUALITY_RUNS = (
    ("f16", {"kv_type": "f16"}),
    ("q8_0 (llama.cpp reads)", {"kv_type": "q8_0", "read_in_f16": False}),
    ("q8_0 (read in f16, converted)", {"kv_type": "q8_0", "read_in_f16": True}),
)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - float(logits.max())
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum())
    return result


def bench_kv_quality(
    n_tokens: int,
    window: int,
    run: Run,
    text: str | None = None,
) -> dict[str, Any]:
    """The same tokens at the same positions through an f16 cache and through q8_0 caches
    (llama.cpp's own, and Galahad's f16 read converted to q8_0): the first `n_tokens` are
    read into the cache, then each of the next `window` tokens is predicted from it. Reports
    the KL divergence of each q8_0 run's next-token distribution from f16's (mean, 99th
    percentile), top-1 agreement and every run's perplexity on the window."""
    log, bench = run.log, run.bench(n_ctx=context_for(n_tokens + window))
    engines: list[Engine] = []
    try:
        core = bench.core
        source = text if text is not None else bench.text_of_tokens(n_tokens + window + 64)
        base = llama_engine(core)
        tokens = (base.bos() + base.encode_text(source))[: n_tokens + window]
        if len(tokens) < n_tokens + window:
            raise InputError(
                f"The text has {len(tokens):,} tokens; {n_tokens + window:,} are needed."
            )
        context, scored = tokens[:n_tokens], tokens[n_tokens:]
        config = engine_config(core.settings, core.model_path)
        core.live.close()  # the runs below own the engines
        for name, changes in QUALITY_RUNS:
            engine = Engine(replace(config, **changes))
            engines.append(engine)
            start = time.perf_counter()
            engine.evaluate(context)
            log(f"kv-quality: {name} read {len(context):,} tokens in {ms_since(start):,.0f} ms")
        kl: dict[str, list[float]] = {name: [] for name, _c in QUALITY_RUNS[1:]}
        agree: dict[str, int] = dict.fromkeys(kl, 0)
        nll: dict[str, float] = {name: 0.0 for name, _c in QUALITY_RUNS}
        for token in scored:
            probs = [_log_softmax(engine.last_logits()) for engine in engines]
            reference = probs[0]
            for (name, _c), logp in zip(QUALITY_RUNS, probs, strict=True):
                nll[name] -= float(logp[token])
                if name in kl:
                    kl[name].append(float(np.sum(np.exp(reference) * (reference - logp))))
                    agree[name] += int(np.argmax(logp) == np.argmax(reference))
            for engine in engines:
                engine.evaluate([token])
        rows: list[dict[str, Any]] = []
        for name, _c in QUALITY_RUNS:
            row: dict[str, Any] = {
                "run": name,
                "perplexity": float(np.exp(nll[name] / len(scored))),
            }
            if name in kl:
                values = np.array(kl[name])
                row["kl_mean"] = float(values.mean())
                row["kl_p99"] = float(np.percentile(values, 99))
                row["top1_agreement"] = agree[name] / len(scored)
            rows.append(row)
        report = bench.report("bench kv-quality", rows)
        report.update({"context_tokens": len(context), "scored_tokens": len(scored)})
        return report
    finally:
        for engine in engines:
            engine.close()
        bench.close()


def quality_table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['context_tokens']:,} tokens read, {result['scored_tokens']:,} predicted",
        f"{'run':<30} {'KL mean':>9} {'KL p99':>9} {'top-1':>7} {'perplexity':>11}",
    ]
    for r in result["results"]:
        if "kl_mean" in r:
            lines.append(
                f"{r['run']:<30} {r['kl_mean']:>9.5f} {r['kl_p99']:>9.5f} "
                f"{r['top1_agreement']:>6.1%} {r['perplexity']:>11.3f}"
            )
        else:
            lines.append(f"{r['run']:<30} {'-':>9} {'-':>9} {'-':>7} {r['perplexity']:>11.3f}")
    return "\n".join(lines)


def resume_table(result: dict[str, Any]) -> str:
    head = (
        f"{'tokens':>7} {'KV':>5} {'prefill':>9} {'restore':>8} {'proof':>6} {'floor':>7} "
        f"{'seqfile':>8} {'block MB':>9} {'B/token':>8} {'×prefill':>9} {'×seqfile':>9}"
    )
    lines = [head]
    for r in result["results"]:
        lines.append(
            f"{r['tokens']:>7,} {r.get('kv_type', 'f16'):>5} {r['prefill_ms']:>8.0f}ms "
            f"{r['restore_ms']:>6.1f}ms "
            f"{r['proof_ms']:>4.0f}ms {r['floor_ms']:>5.1f}ms {r['seq_file_ms']:>6.1f}ms "
            f"{r['block_bytes'] / 1e6:>9.1f} {r['bytes_per_token']:>8,.0f} "
            f"{r['speedup_vs_prefill']:>8.0f}× {r['ratio_to_seq_file']:>8.2f}×  {r['proof']}"
        )
    return "\n".join(lines)


def deposit_table(result: dict[str, Any]) -> str:
    lines = [
        f"{'tokens':>7} {'KV':>5} {'llama.cpp prev':>15} {'llama.cpp best':>15} "
        f"{'same KV':>9} {'deposit':>9} {'÷best':>6} {'×prev':>6} {'decode':>9} "
        f"{'peak RSS':>9}  ask"
    ]
    for r in result["results"]:
        lines.append(
            f"{r['tokens']:>7,} {r.get('kv_type', 'f16'):>5} "
            f"{r['raw_prefill_default_ms']:>13.0f}ms {r['raw_prefill_best_ms']:>13.0f}ms "
            f"{r.get('raw_prefill_same_kv_ms', 0):>7.0f}ms {r['deposit_ms']:>7.0f}ms "
            f"{r['deposit_over_best']:>5.2f} {r['speedup_vs_default']:>5.2f} "
            f"{r.get('decode_tokens_per_s', 0):>5.1f}t/s {r['peak_rss_mb']:>7.0f}MB  "
            f"{r['ask_proof']}"
        )
    return "\n".join(lines)


def bench_picture(
    reps: int,
    run: Run,
    picture: Path | None = None,
) -> dict[str, Any]:
    """One picture stored as a document, then restored from its block (and proved) against
    reading it again from the picture (vision encoder and prefill of its tokens), each in a
    new context, alternating. `picture`: a file of the user's (default: a generated photo)."""
    bench = run.bench()
    try:
        if picture is None:
            picture = bench.tmp / "photo.png"
            _generated_photo(picture)
        deposited = bench.core.deposit(picture)
        if not deposited.pictures:
            raise InputError(f"'{picture.name}' was not read as a picture.")
        run.log(f"resume --image: {deposited.image_tokens} image tokens of {deposited.tokens}")
        out = {
            "picture": picture.name,
            "image_tokens": deposited.image_tokens,
            **_restore_against_reread(bench, deposited, reps),
        }
        return bench.report("bench resume --image", [out])
    finally:
        bench.close()


def bench_audio(reps: int, run: Run, memo: Path | None = None) -> dict[str, Any]:
    """One voice memo stored as a document (in its parts, at most 30 s each), then every
    part restored from its block (and proved) against hearing it again (audio encoder and
    prefill of its positions), each part in a new context, alternating. `memo`: a file of
    the user's (default: 60 seconds spoken by espeak-ng)."""
    bench = run.bench()
    try:
        if memo is None:
            memo = _generated_memo(bench.tmp, 60.0)
        deposited = bench.core.deposit(memo)
        if not deposited.sounds:
            raise InputError(f"'{memo.name}' was not heard as a voice memo.")
        run.log(
            f"resume --audio: {deposited.audio_seconds:.1f} s in {deposited.sounds} parts, "
            f"{deposited.audio_tokens} audio tokens of {deposited.tokens}"
        )
        out = {
            "memo": memo.name,
            "seconds": deposited.audio_seconds,
            "parts": deposited.n_parts,
            "audio_tokens": deposited.audio_tokens,
            **_restore_against_reread(bench, deposited, reps),
        }
        return bench.report("bench resume --audio", [out])
    finally:
        bench.close()


def _restore_against_reread(bench: Bench, deposited: Any, reps: int) -> dict[str, Any]:
    """Every part of a stored picture or memo document restored from its block and proved,
    against reading it again through the projector, in new contexts, alternating (medians
    of the whole document's sums)."""
    core = bench.core
    owners = {deposited.document_id}
    parts = []
    for part in core.parts(deposited.document_id):
        row = core.vault.block_row(part.block_id)
        media = core.documents.part_pictures(part.block_id)
        parts.append((part.block_id, core.vault.block_tokens(row), media, row["file_bytes"]))
    reread: list[float] = []
    encode: list[float] = []
    restore: list[float] = []
    proof_ms: list[float] = []
    verdicts: list[str] = []
    for rep in range(reps):
        for turn in (0, 1) if rep % 2 == 0 else (1, 0):
            sums = [0.0, 0.0]
            for block_id, ledger, media, _size in parts:
                bench.fresh_engine()
                core.live.vision()  # the projector loads untimed, like the model
                if turn == 0:
                    restore_ms, _n, result = core.live.restore_and_prove(block_id, owners)
                    sums[0] += restore_ms
                    sums[1] += result.proof_ms
                    verdicts.append(result.verdict)
                else:
                    read = core.live.evaluate_ledger(ledger, media)
                    sums[0] += read.elapsed_ms
                    sums[1] += read.encode_ms
            (restore if turn == 0 else reread).append(sums[0])
            (proof_ms if turn == 0 else encode).append(sums[1])
    out: dict[str, Any] = {
        "tokens": sum(len(ledger) for _b, ledger, _m, _s in parts),
        "reread_ms": median(reread),  # the projector's encoder + prefill of every position
        "encode_ms": median(encode),  # of which the encoder
        "restore_ms": median(restore),
        "proof_ms": median(proof_ms),
        "proof": "exact" if set(verdicts) == {"exact"} else ",".join(sorted(set(verdicts))),
        "block_bytes": sum(size for _b, _l, _m, size in parts),
        "reps": reps,
        "vision": dataclasses.asdict(core.vision_status()),
        "config": config_of(core),
    }
    out["speedup_vs_reread"] = out["reread_ms"] / out["restore_ms"]
    return out


def _generated_memo(folder: Path, seconds: float) -> Path:
    """About `seconds` of speech from espeak-ng (sentences with pauses), as a 16 kHz WAV."""
    import wave

    from galahad_desktop.engine.picture import SOUND_RATE, Sound

    sentences = [f"{bench_line(i)}" for i in range(400)]
    pcm = b""
    for sentence in sentences:
        spoken = folder / "sentence.wav"
        subprocess.run(
            ["espeak-ng", "-s", "150", "-w", str(spoken), sentence], check=True, capture_output=True
        )
        with wave.open(str(spoken), "rb") as reader:
            rate, frames = reader.getframerate(), reader.readframes(reader.getnframes())
        samples = np.frombuffer(frames, dtype="<i2")
        resampled = np.interp(
            np.arange(0, len(samples), rate / SOUND_RATE), np.arange(len(samples)), samples
        ).astype("<i2")
        pcm += resampled.tobytes() + bytes(SOUND_RATE // 2 * 2)  # half a second's pause
        if len(pcm) >= seconds * SOUND_RATE * 2:
            break
    path = folder / "memo.wav"
    path.write_bytes(Sound.from_pcm(pcm[: int(seconds * SOUND_RATE) * 2]).wav)
    return path


def bench_line(index: int) -> str:
    words = _WORDS[index % len(_WORDS) :] + _WORDS[: index % len(_WORDS)]
    return f"The {' '.join(words[:9])} number {index + 1}."


def _generated_photo(path: Path) -> None:
    """A 1024×768 photo-like picture: smooth gradients under noise (PIL, no files)."""
    from PIL import Image

    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:768, 0:1024]
    base = np.stack([x / 4, y / 3, (x + y) / 7], axis=-1) % 256
    noise = rng.normal(0, 24, base.shape)
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)


def audio_table(result: dict[str, Any]) -> str:
    lines = [
        f"{'memo':>12} {'seconds':>7} {'parts':>5} {'tokens':>7} {'audio':>6} {'re-read':>9} "
        f"{'encoder':>8} {'restore':>8} {'proof':>6} {'block MB':>9} {'×re-read':>9}"
    ]
    for r in result["results"]:
        lines.append(
            f"{r['memo'][-12:]:>12} {r['seconds']:>7.1f} {r['parts']:>5} {r['tokens']:>7,} "
            f"{r['audio_tokens']:>6,} {r['reread_ms']:>7.0f}ms {r['encode_ms']:>6.0f}ms "
            f"{r['restore_ms']:>6.1f}ms {r['proof_ms']:>4.0f}ms {r['block_bytes'] / 1e6:>9.2f} "
            f"{r['speedup_vs_reread']:>8.1f}×  {r['proof']}"
        )
    return "\n".join(lines)


def picture_table(result: dict[str, Any]) -> str:
    lines = [
        f"{'picture':>14} {'tokens':>7} {'image':>6} {'re-read':>9} {'encoder':>8} "
        f"{'restore':>8} {'proof':>6} {'block MB':>9} {'×re-read':>9}"
    ]
    for r in result["results"]:
        lines.append(
            f"{r['picture'][-14:]:>14} {r['tokens']:>7,} {r['image_tokens']:>6,} "
            f"{r['reread_ms']:>7.0f}ms {r['encode_ms']:>6.0f}ms {r['restore_ms']:>6.1f}ms "
            f"{r['proof_ms']:>4.0f}ms {r['block_bytes'] / 1e6:>9.2f} "
            f"{r['speedup_vs_reread']:>8.1f}×  {r['proof']}"
        )
    return "\n".join(lines)
