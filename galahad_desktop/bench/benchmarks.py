"""`galahad bench resume|persist|deposit`: our path against what people use instead, measured
side by side in one run (medians of repetitions), with the runtime fingerprint.

Absolute times on shared machines drift; the ratios within one run are the result.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from galahad_desktop.bench.corpus import Corpus
from galahad_desktop.engine import proof as proofs
from galahad_desktop.memory.service import Galahad
from galahad_desktop.vault.blockfile import CHUNK_BYTES
from galahad_desktop.vault.keys import MemoryKeyStore

Log = Callable[[str], None]


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def context_for(max_tokens: int) -> int:
    return ((max_tokens + 1024) // 256 + 1) * 256


class Bench:
    """A throwaway data directory and keystore (benchmarks never touch the user's data)."""

    def __init__(self, model_path: Path | None, overrides: dict[str, Any], log: Log) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="galahad-bench-"))
        self.keystore = MemoryKeyStore()
        self.model_path = model_path
        self.overrides = overrides
        self.log = log
        self.core = self.open_core()
        self.corpus = Corpus(seed=int(overrides.get("seed", 0)) + 1234)

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

    def text_of_tokens(self, target: int) -> str:
        """Generated text whose document turn is as close to `target` tokens as whole lines
        allow (never above)."""

        def count(lines: list[str]) -> int:
            return len(self.core.document_tokens("bench.txt", "\n".join(lines)))

        lines: list[str] = []
        while count(lines) <= target:
            lines += self.corpus.filler(max(40, target // 16))
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
            "fingerprint_details": engine.fingerprint_details,
            "machine": machine(),
        }

    def close(self) -> None:
        self.core.close()
        for path in sorted(self.tmp.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        self.tmp.rmdir()


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
    elapsed = _ms(start)
    path.unlink()
    return elapsed


def bench_resume(
    sizes: list[int], reps: int, model_path: Path | None, overrides: dict[str, Any], log: Log
) -> dict[str, Any]:
    bench = Bench(model_path, {**overrides, "n_ctx": context_for(max(sizes))}, log)
    rows = []
    try:
        for size in sizes:
            text = bench.text_of_tokens(size)
            core = bench.core
            deposited = core.deposit_text("bench.txt", text)
            row_block = core.vault.block_row(deposited.block_id)
            tokens = core.vault.block_tokens(row_block)
            n = len(tokens)
            log(f"resume: {n:,} tokens")
            prefill, restore, proof_ms, verdicts = [], [], [], []
            core.vault._wipe_buffer()  # the first restore below pays for a fresh buffer
            seq_load, seq_save, pickle_load, pickle_save = [], [], [], []
            seq_bytes = pickle_bytes = 0
            for _ in range(reps):
                bench.fresh_engine()
                engine = core.engine
                start = time.perf_counter()
                engine.evaluate(tokens)
                prefill.append(_ms(start))

                bench.fresh_engine()
                engine = core.engine
                start = time.perf_counter()
                stored = core.vault.read_block(deposited.block_id)
                engine.restore(stored.payload, stored.tokens, stored.size)
                restore.append(_ms(start))
                del stored.payload
                record = proofs.ProofRecord.from_dict(stored.meta["proof"])
                start = time.perf_counter()
                engine.evaluate(record.probe_tokens)
                verdict = proofs.compare(record, engine.last_logits(), 0.0).verdict
                proof_ms.append(_ms(start))
                verdicts.append(verdict)

                # llama.cpp's own per-sequence state file (llama-server's slot save): plain.
                # The context holds the same state (grafted byte-exact), so it is saved as is.
                engine.reset()
                again = core.vault.read_block(deposited.block_id)
                engine.restore(again.payload, again.tokens, again.size)
                seq_path = bench.tmp / "seq.bin"
                token_array = (llama_cpp.llama_token * n)(*tokens)
                start = time.perf_counter()
                llama_cpp.llama_state_seq_save_file(
                    engine._ctx, str(seq_path).encode(), 0, token_array, n
                )
                seq_save.append(_ms(start))
                seq_bytes = seq_path.stat().st_size
                bench.fresh_engine()
                engine = core.engine
                out_tokens = (llama_cpp.llama_token * (n + 16))()
                count = ctypes.c_size_t(0)
                start = time.perf_counter()
                loaded = llama_cpp.llama_state_seq_load_file(
                    engine._ctx, str(seq_path).encode(), 0, out_tokens, n + 16, ctypes.byref(count)
                )
                seq_load.append(_ms(start))
                seq_path.unlink()
                if loaded == 0:
                    raise RuntimeError("llama_state_seq_load_file failed")

                # llama-cpp-python's save_state + pickle (what LlamaDiskCache stores).
                engine.reset()
                again = core.vault.read_block(deposited.block_id)
                engine.restore(again.payload, again.tokens, again.size)
                pickle_path = bench.tmp / "state.pkl"
                start = time.perf_counter()
                state = engine.llm.save_state()
                with open(pickle_path, "wb") as handle:
                    pickle.dump(state, handle, protocol=pickle.HIGHEST_PROTOCOL)
                pickle_save.append(_ms(start))
                del state
                pickle_bytes = pickle_path.stat().st_size
                bench.fresh_engine()
                engine = core.engine
                start = time.perf_counter()
                with open(pickle_path, "rb") as handle:
                    state = pickle.load(handle)
                engine.llm.load_state(state)
                pickle_load.append(_ms(start))
                del state
                pickle_path.unlink()
            floors = [floor_ms(row_block["payload_bytes"], bench.tmp) for _ in range(reps)]
            result = {
                "tokens": n,
                "prefill_ms": _median(prefill),
                "restore_ms": _median(restore),
                "restore_first_ms": restore[0],
                "proof_ms": _median(proof_ms),
                "proof": "exact" if set(verdicts) == {"exact"} else ",".join(sorted(set(verdicts))),
                "floor_ms": _median(floors),
                "seq_file_ms": _median(seq_load),
                "seq_file_save_ms": _median(seq_save),
                "pickle_state_ms": _median(pickle_load),
                "pickle_state_save_ms": _median(pickle_save),
                "capture_ms": row_block["capture_ms"],
                "block_bytes": row_block["file_bytes"],
                "seq_file_bytes": seq_bytes,
                "pickle_state_bytes": pickle_bytes,
                "reps": reps,
            }
            result["speedup_vs_prefill"] = result["prefill_ms"] / result["restore_ms"]
            result["ratio_to_floor"] = result["restore_ms"] / result["floor_ms"]
            result["bytes_per_token"] = result["block_bytes"] / n
            rows.append(result)
        return bench.report("bench resume", rows)
    finally:
        bench.close()


def bench_persist(
    sizes: list[int], turns: int, model_path: Path | None, overrides: dict[str, Any], log: Log
) -> dict[str, Any]:
    """Per-turn save of a conversation of each size, as a chain link (only the new tokens)
    and as a whole state, side by side in one process."""
    bench = Bench(model_path, {**overrides, "n_ctx": context_for(max(sizes) + 200 * turns)}, log)
    rows = []
    try:
        core = bench.core
        for size in sizes:
            for mode in ("chain", "whole"):
                core.settings.override({"chain_blocks": mode == "chain"})
                conversation = core.new_conversation()
                first = core.send(
                    conversation,
                    bench.text_of_tokens(size - 30),
                    params=core.sampling(max_tokens=4, temperature=0.0),
                )
                log(f"persist ({mode}): conversation of {first.context_tokens:,} tokens")
                for turn in range(turns):
                    result = core.send(
                        conversation,
                        f"Add one line about item {turn}.",
                        params=core.sampling(max_tokens=16, temperature=0.0),
                    )
                    block = core.vault.block_row(core.head_block(conversation))
                    rows.append(
                        {
                            "mode": mode,
                            "conversation_tokens": block["pos_end"],
                            "new_tokens": block["pos_end"] - (block["pos_start"] or 0)
                            if mode == "chain"
                            else result.counters.new_tokens + result.counters.generated_tokens,
                            "persist_ms": result.counters.persist_ms,
                            "capture_ms": block["capture_ms"],
                            "block_bytes": block["file_bytes"],
                        }
                    )
                resumes = [core.resume(conversation) for _ in range(3)]
                rows[-1]["resume_ms"] = _median([g.restore_ms for g in resumes])
                rows[-1]["resume_proof"] = resumes[-1].proof.verdict
                rows[-1]["links"] = core.chain_links(conversation)
                core.forget(conversation)
        summary = []
        for size in sizes:
            chain = [
                r
                for r in rows
                if r["mode"] == "chain" and abs(r["conversation_tokens"] - size) < size * 0.2 + 300
            ]
            whole = [
                r
                for r in rows
                if r["mode"] == "whole" and abs(r["conversation_tokens"] - size) < size * 0.2 + 300
            ]
            if chain and whole:
                c_ms = _median([r["persist_ms"] for r in chain])
                w_ms = _median([r["persist_ms"] for r in whole])
                summary.append(
                    {
                        "size": size,
                        "chain_persist_ms": c_ms,
                        "whole_persist_ms": w_ms,
                        "whole_over_chain": w_ms / c_ms if c_ms else None,
                        "chain_block_bytes": _median([r["block_bytes"] for r in chain]),
                        "whole_block_bytes": _median([r["block_bytes"] for r in whole]),
                        "chain_resume_ms": chain[-1]["resume_ms"],
                        "whole_resume_ms": whole[-1]["resume_ms"],
                        "chain_links": chain[-1]["links"],
                        "resume_proofs": [chain[-1]["resume_proof"], whole[-1]["resume_proof"]],
                    }
                )
        report = bench.report("bench persist", rows)
        report["summary"] = summary
        return report
    finally:
        bench.close()


def bench_deposit(
    sizes: list[int], reps: int, model_path: Path | None, overrides: dict[str, Any], log: Log
) -> dict[str, Any]:
    bench = Bench(model_path, {**overrides, "n_ctx": context_for(max(sizes))}, log)
    rows = []
    try:
        core = bench.core
        for size in sizes:
            text = bench.text_of_tokens(size)
            tokens = core.document_tokens("bench.txt", text)
            raw, deposit = [], []
            for _ in range(reps):
                core.engine.reset()
                start = time.perf_counter()
                core.engine.evaluate(tokens)
                raw.append(_ms(start))
                start = time.perf_counter()
                core.deposit_text("bench.txt", text)
                deposit.append(_ms(start))
            log(f"deposit: {len(tokens):,} tokens")
            row = {
                "tokens": len(tokens),
                "raw_prefill_ms": _median(raw),
                "deposit_ms": _median(deposit),
                "reps": reps,
            }
            row["overhead_percent"] = 100.0 * (row["deposit_ms"] / row["raw_prefill_ms"] - 1)
            rows.append(row)
        return bench.report("bench deposit", rows)
    finally:
        bench.close()


def plot_resume(result: dict[str, Any], path: Path) -> bool:
    """Write the PNG plot; False when matplotlib (the `bench` extra) is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    tokens = [r["tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = (
        ("prefill_ms", "re-prefill (cold)"),
        ("pickle_state_ms", "save_state + pickle"),
        ("seq_file_ms", "llama.cpp seq file (plain)"),
        ("restore_ms", "Galahad restore"),
        ("floor_ms", "floor: read + decrypt + copy"),
    )
    for key, label in series:
        ax.plot(tokens, [r[key] for r in rows], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("ms (median)")
    ax.set_title("Resume time against tokens (Gemma 3 270M, CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def resume_table(result: dict[str, Any]) -> str:
    head = (
        f"{'tokens':>7} {'prefill':>9} {'restore':>8} {'proof':>6} {'floor':>7} "
        f"{'seqfile':>8} {'pickle':>8} {'block MB':>9} {'seq MB':>7} {'pkl MB':>7} "
        f"{'×prefill':>9} {'×floor':>7}"
    )
    lines = [head]
    for r in result["results"]:
        lines.append(
            f"{r['tokens']:>7,} {r['prefill_ms']:>8.0f}ms {r['restore_ms']:>6.1f}ms "
            f"{r['proof_ms']:>4.0f}ms {r['floor_ms']:>5.1f}ms {r['seq_file_ms']:>6.1f}ms "
            f"{r['pickle_state_ms']:>6.0f}ms {r['block_bytes'] / 1e6:>9.1f} "
            f"{r['seq_file_bytes'] / 1e6:>7.1f} {r['pickle_state_bytes'] / 1e6:>7.1f} "
            f"{r['speedup_vs_prefill']:>8.0f}× {r['ratio_to_floor']:>6.2f}×"
        )
    return "\n".join(lines)
