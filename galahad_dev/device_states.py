"""Are KV states interchangeable between devices? The same tokens read on the CPU and on a
device (llama.cpp's RPC device; a Vulkan device when the build has one and it is visible),
side by side in one process: the state bytes, the next-token logits, and each device's
state restored into the other's context.

Run: .venv/bin/python -m galahad_dev.device_states [--tokens 1000] [--json]
     (GGML_VK_VISIBLE_DEVICES=0 adds Mesa's lavapipe, a Vulkan device on the CPU)
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np

from galahad_desktop.engine import devices
from galahad_desktop.engine.engine import Engine
from galahad_desktop.engine.values import EngineConfig
from galahad_desktop.paths import default_model_path
from galahad_dev.bench import stamp
from galahad_dev.corpus import Corpus


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max()
        out: np.ndarray = x - np.log(np.exp(x).sum())
        return out

    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def _serve(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "galahad_desktop.cli", "serve-device", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the device server did not start")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = _serve(port)
    endpoint = f"127.0.0.1:{port}"
    try:
        runtimes: dict[str, dict[str, Any]] = {"CPU": {"n_gpu_layers": 0}}
        runtimes["RPC"] = {"rpc_servers": (endpoint,)}
        vulkan = [d for d in devices.gpu_devices() if d.backend == "Vulkan"]
        if vulkan:
            runtimes[vulkan[0].name] = {}
        text = Corpus(11).document(args.tokens, 0, needles=1, decoys=1)[0]
        results: dict[str, dict[str, Any]] = {}
        states: dict[str, bytes] = {}
        engines: dict[str, Engine] = {}
        tokens: list[int] = []
        probe: list[int] = []
        for name, extra in runtimes.items():
            config = EngineConfig(model_path=default_model_path(), n_ctx=4096, **extra)
            engine = Engine(config)
            engines[name] = engine
            if not tokens:
                tokens = (engine.bos() + engine.encode_text(text))[: args.tokens]
                probe = engine.encode_text("\nQuestion: who rode north?")
            start = time.perf_counter()
            engine.evaluate(tokens)
            prefill_ms = (time.perf_counter() - start) * 1e3
            buf, used, _ms = engine.capture()
            states[name] = bytes(buf[:used])
            engine.evaluate(probe)
            logits = engine.last_logits()
            results[name] = {
                "device": engine.placement.device,
                "prefill_ms": round(prefill_ms, 1),
                "state_bytes": used,
                "state_sha256": hashlib.sha256(states[name]).hexdigest()[:16],
                "logits_sha256": hashlib.sha256(logits.tobytes()).hexdigest()[:16],
                "logits": logits,
            }
        cross: list[dict[str, Any]] = []
        for source in runtimes:
            for target in runtimes:
                engine = engines[target]
                payload = (ctypes.c_uint8 * len(states[source])).from_buffer_copy(states[source])
                engine.restore(payload, tokens)
                engine.evaluate(probe)
                logits = engine.last_logits()
                own = results[target]["logits"]
                cross.append(
                    {
                        "state_from": source,
                        "restored_on": target,
                        "logits_identical": bool(np.array_equal(logits, own)),
                        "kl_vs_fresh": _kl(own, logits),
                        "top1_agrees": int(logits.argmax()) == int(own.argmax()),
                    }
                )
        names = list(runtimes)
        for name in names:
            results[name]["state_identical_to_cpu"] = states[name] == states["CPU"]
            results[name]["kl_vs_cpu"] = _kl(results["CPU"]["logits"], results[name]["logits"])
        for name in names:
            del results[name]["logits"]
        for engine in engines.values():
            engine.close()
    finally:
        server.terminate()
        server.wait()
    report = {"tokens": len(tokens), "devices": results, "cross": cross, "stamp": stamp()}
    if args.json:
        print(json.dumps(report))
    else:
        for name, row in results.items():
            print(f"{name:10} {json.dumps(row)}")
        for row in cross:
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
