"""Time to first token of the local API server against llama-cpp-python's own server.

The peer ships in the same package (`python -m llama_cpp.server`, the `[server]` extra):
same model file, context, threads and batch, side by side in one run. A ~4,000-token
history (turns written through `galahad serve`, so the replies are the model's own) plus one
new message is sent as an OpenAI client sends it: the whole history, streamed, and the time
to the first token is measured at the client.

- **hot**: the history was the last thing each server answered (the peer's context and RAM
  prompt cache hold it; ours holds it in the context too);
- **after a restart**: a new process. The peer without a cache re-reads everything; the peer
  with `--cache true --cache_type disk` loads its pickled state (plain text, no proof); ours
  grafts the stored, encrypted blocks and proves them;
- **streaming overhead**: per-token time seen by a streaming client against the engine's own
  decode time for the same reply (in-process, through the facade).

Run: scripts/with-keyring.sh .venv/bin/python -m galahad_dev.server_ttft [--tokens 4000] [--json]
Needs the peer: pip install "llama-cpp-python[server]==0.3.36" (in the `bench` extra).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletionMessageParam

from galahad_desktop.paths import default_model_path
from galahad_dev.bench import stamp
from galahad_dev.corpus import Corpus

ROOT = Path(__file__).resolve().parent.parent
N_CTX, THREADS, BATCH = 8192, 2, 512
# This build loads its CPU kernels as modules (one per CPU level): the peer's process loads
# them the way ours does, then runs llama-cpp-python's own server unchanged.
PEER_MAIN = (
    "import sys; from galahad_desktop.engine.devices import load_backends; load_backends(); "
    "from llama_cpp.server.__main__ import main; sys.argv[0] = 'llama_cpp.server'; main()"
)
NEW = "Which depot was audited most recently, and by whom?"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(base_url: str, key: str, proc: subprocess.Popen[str], limit_s: float = 240) -> None:
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=5)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited {proc.returncode}: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        try:
            client.models.list()
            return
        except openai.APIError:
            time.sleep(0.25)
    raise SystemExit("server did not start")


class Ours:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> openai.OpenAI:
        port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "galahad_desktop.cli",
                "--data-dir",
                str(self.data),
                "--set",
                f"n_ctx={N_CTX}",
                "--set",
                f"n_threads={THREADS}",
                "--set",
                f"n_batch={BATCH}",
                "--set",
                "temperature=0",
                "serve",
                "--port",
                str(port),
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]
        wait_ready(ready["base_url"], ready["api_key"], self.proc)
        return openai.OpenAI(base_url=ready["base_url"], api_key=ready["api_key"], timeout=600)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(2)
            self.proc.wait(60)


class Peer:
    def __init__(self, model: Path, cache: str | None, cache_dir: Path) -> None:
        self.model, self.cache, self.cache_dir = model, cache, cache_dir
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> openai.OpenAI:
        port = free_port()
        # Its default logits_all=true keeps every position's logits (8,192 × 262,144 floats):
        # slower reads, and a `save_state` (what its caches store) of 8.6 GB that its 2 GiB
        # cache drops at once. Off, as ours computes only the last position's.
        cache = ["--cache", "true", "--cache_type", self.cache] if self.cache else []
        cache += ["--logits_all", "false"]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                PEER_MAIN,
                "--model",
                str(self.model),
                "--n_ctx",
                str(N_CTX),
                "--n_threads",
                str(THREADS),
                "--n_batch",
                str(BATCH),
                "--chat_format",
                "gemma",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *cache,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.cache_dir,
        )
        base = f"http://127.0.0.1:{port}/v1"
        wait_ready(base, "none", self.proc)
        return openai.OpenAI(base_url=base, api_key="none", timeout=600)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(60)


def _cached(usage: Any) -> int | None:
    """The prompt tokens a server said it served from its cache (None: no usage given)."""
    return usage.prompt_tokens_details.cached_tokens if usage else None


def first_token_ms(
    client: openai.OpenAI, messages: list[ChatCompletionMessageParam]
) -> tuple[float, Any]:
    """Time from sending to the first streamed token; the usage when the server gives it."""
    start = time.perf_counter()
    first, usage = None, None
    stream = client.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if (
            first is None
            and chunk.choices
            and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason)
        ):
            first = (time.perf_counter() - start) * 1e3
        if chunk.usage is not None:
            usage = chunk.usage
    return first if first is not None else float("nan"), usage


def asking(
    history: list[ChatCompletionMessageParam], text: str
) -> list[ChatCompletionMessageParam]:
    """The history and one more user message, as a client sends them."""
    return [*history, {"role": "user", "content": text}]


def per_token_ms(
    client: openai.OpenAI, messages: list[ChatCompletionMessageParam], n: int
) -> tuple[float, int]:
    stamps: list[float] = []
    for chunk in client.chat.completions.create(
        model="m", messages=messages, max_tokens=n, temperature=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
    if len(stamps) < 2:
        return float("nan"), len(stamps)
    return (stamps[-1] - stamps[0]) * 1e3 / (len(stamps) - 1), len(stamps)


DOC_QUESTIONS = ("Which depot is named first?", "Who signed the last record?")
DOCUMENT = " ".join(Corpus(11).filler(1460))


def pasted(question: str) -> list[ChatCompletionMessageParam]:
    """A new chat that begins with a pasted document (~3,000 tokens), then a question."""
    return [{"role": "user", "content": f"{DOCUMENT}\n\n{question}"}]


def build_history(
    client: openai.OpenAI, tokens: int
) -> tuple[list[ChatCompletionMessageParam], int]:
    """Turns of ~450 tokens written through our server until the history holds `tokens`."""
    corpus = Corpus(7)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You keep the depot records and answer briefly."}
    ]
    held = 0
    while held < tokens:
        messages.append({"role": "user", "content": " ".join(corpus.filler(300))})
        reply = client.chat.completions.create(
            model="m", messages=messages, max_tokens=24, temperature=0
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        assert reply.usage is not None
        held = reply.usage.prompt_tokens + reply.usage.completion_tokens
    return messages, held


def streaming_overhead(
    data: Path, messages: list[ChatCompletionMessageParam], n: int
) -> dict[str, float]:
    """The engine's own decode time per token for the reply the server streams."""
    from galahad_desktop.memory.galahad import Galahad
    from galahad_desktop.memory.results import ChatMessage, ChatRole

    core = Galahad(data, overrides={"n_ctx": N_CTX, "n_threads": THREADS, "n_batch": BATCH})
    try:
        done = core.complete_chat(
            [ChatMessage(cast(ChatRole, m["role"]), str(m.get("content") or "")) for m in messages],
            max_tokens=n,
            temperature=0,
        )
        c = done.turn.counters
        return {
            "engine_ms_per_token": c.generate_ms / max(1, c.generated_tokens),
            "tokens": c.generated_tokens,
        }
    finally:
        core.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = default_model_path()
    work = Path(tempfile.mkdtemp(prefix="galahad-bench-server-"))
    ours = Ours(work / "data")
    client = ours.start()
    history, held = build_history(client, args.tokens)
    ask = asking(history, NEW)
    ours_hot, hot_usage = first_token_ms(client, ask)
    ours.stop()
    client = ours.start()
    ask2 = asking(history, NEW + " Answer in one line.")
    ours_restart, restart_usage = first_token_ms(client, ask2)
    ask3 = asking(history, "Name one person from the records.")
    stream_ms, streamed = per_token_ms(client, ask3, 48)
    ours.stop()
    # The same request to a server that never saw it: everything is read (a plain server's cost).
    fresh = Ours(work / "fresh")
    client = fresh.start()
    ours_fresh, _ = first_token_ms(client, ask2)
    # A document pasted at the start of a new chat, then again with another question (after
    # a restart): the second reads only its question.
    pasted_first, _ = first_token_ms(client, pasted(DOC_QUESTIONS[0]))
    fresh.stop()
    client = fresh.start()
    pasted_again, pasted_usage = first_token_ms(client, pasted(DOC_QUESTIONS[1]))
    fresh.stop()
    overhead = streaming_overhead(
        work / "data",
        asking(history, "Name one person in the records, please."),
        48,
    )
    # The peer, same model and settings.
    peer = Peer(model, "ram", work)
    pc = peer.start()
    first_token_ms(pc, ask)  # reads the history once
    peer_hot, _ = first_token_ms(pc, ask2)  # hot: its context and RAM cache hold it
    first_token_ms(pc, pasted(DOC_QUESTIONS[0]))
    peer_pasted_hot, _ = first_token_ms(pc, pasted(DOC_QUESTIONS[1]))  # its prefix reuse
    peer.stop()
    peer = Peer(model, None, work)
    pc = peer.start()
    peer_cold, _ = first_token_ms(pc, ask2)  # a restart without a cache: everything again
    peer.stop()
    disk = Peer(model, "disk", work)
    pc = disk.start()
    first_token_ms(pc, ask)  # fills its disk cache
    disk.stop()
    pc = disk.start()
    peer_disk, _ = first_token_ms(pc, ask2)
    disk.stop()
    peer_cache = work / ".cache"  # LlamaDiskCache's folder, under the peer's working directory
    cache_bytes = sum(p.stat().st_size for p in peer_cache.rglob("*") if p.is_file())
    blocks = sum(p.stat().st_size for p in (work / "data" / "blocks").rglob("*") if p.is_file())
    result = {
        "history_tokens": held,
        "ours_hot_ms": ours_hot,
        "ours_after_restart_ms": ours_restart,
        "ours_cached_tokens_after_restart": _cached(restart_usage),
        "ours_prompt_tokens_after_restart": restart_usage.prompt_tokens if restart_usage else None,
        "ours_cached_tokens_hot": _cached(hot_usage),
        "ours_fresh_no_history_ms": ours_fresh,
        "pasted_document_first_ms": pasted_first,
        "pasted_document_again_after_restart_ms": pasted_again,
        "pasted_document_cached_tokens": _cached(pasted_usage),
        "pasted_document_prompt_tokens": pasted_usage.prompt_tokens if pasted_usage else None,
        "peer_pasted_document_again_hot_ms": peer_pasted_hot,
        "peer_hot_ms": peer_hot,
        "peer_after_restart_no_cache_ms": peer_cold,
        "peer_after_restart_disk_cache_ms": peer_disk,
        "hot_ratio_ours_over_peer": ours_hot / peer_hot,
        "restart_speedup_vs_no_cache": peer_cold / ours_restart,
        "restart_speedup_vs_disk_cache": peer_disk / ours_restart,
        "streamed_ms_per_token": stream_ms,
        "streamed_tokens": streamed,
        **overhead,
        "streaming_overhead_ms_per_token": stream_ms - overhead["engine_ms_per_token"],
        "ours_block_bytes": blocks,
        "peer_disk_cache_bytes": cache_bytes,
        "stamp": stamp(),
    }
    out = ROOT / "benchmarks" / "results" / "bench-server.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:40} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
