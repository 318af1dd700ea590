"""The model and settings from the terminal: info, models (recommend, get, download), settings,
and the window."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from galahad_desktop.cli.common import (
    Output,
    add_common,
    command_job,
    data_dir_of,
    parse_pairs,
)
from galahad_desktop.errors import InputError

if TYPE_CHECKING:  # imported when a command runs: --help stays quick
    from galahad_desktop.engine.values import Placement
    from galahad_desktop.memory.galahad import Galahad

GIB = 1024**3


def cmd_info(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    info = core.info()
    model = info.model
    lines = [
        f"{model.name}: {model.description} ({model.n_params / 1e6:,.0f}M params, "
        f"{model.quantization}) — {model.label}",
        f"turn format: {info.turn_format_note}"
        + (" · thinking available" if info.supports_thinking else ""),
        f"sampling: {', '.join(f'{k} {v}' for k, v in info.sampling_defaults.as_dict().items())} "
        "(the model's recommendation)",
        f"fingerprint {info.fingerprint[:16]} · context {info.n_ctx:,}",
        *_placement_lines(info.placement),
        f"library routing: {info.routing}"
        + (" — galahad models get embeddinggemma --use" if "BM25)" in info.routing else ""),
        info.vision_note(),
        *[f"settings: {p}" for p in info.settings_problems],
    ]
    out.result(info, "\n".join(lines))
    return 0


def _placement_lines(placement: Placement | None) -> list[str]:
    if placement is None:
        return []
    kv = ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in sorted(placement.kv_buffers.items()))
    features = [k for k, v in placement.cpu_features.items() if v == "1"]
    return [
        f"device: {placement.device} · {placement.gpu_layers}/{placement.total_layers} "
        f"layers offloaded ({placement.reason}) · KV cache on {kv or 'CPU'}",
        f"CPU kernels: {placement.cpu_variant} ({' '.join(features) or 'baseline x86-64'})",
    ]


def cmd_serve_device(args: argparse.Namespace, out: Output) -> int:
    """Serve this computer's CPU as a llama.cpp RPC device on a loopback port (blocks)."""
    from galahad_desktop.engine import devices

    endpoint = f"{args.host}:{args.port}"
    devices.check_port_free(endpoint)

    def ready() -> None:
        print(
            f"galahad: serving the CPU device on {endpoint}, one program at a time (Ctrl+C stops)",
            file=sys.stderr,
            flush=True,
        )

    devices.serve_rpc(endpoint, args.threads, ready)
    print("galahad: stopped serving the CPU device.", file=sys.stderr)
    return 0


def cmd_models(args: argparse.Namespace, out: Output) -> int:
    from galahad_desktop.models import catalog

    if args.action == "recommend":
        speed = catalog.measure_speed(refresh=True) if args.measure else None
        rec = catalog.recommend(n_ctx=args.n_ctx, speed=speed)
        lines = [rec.reason]
        for c in rec.candidates:
            lines.append(
                f"  {'*' if c.size == rec.recommended else ' '} Gemma 4 {c.size:<8} "
                f"{c.bytes / 1e9:5.1f} GB file · needs {c.memory_needed / GIB:5.1f} GiB · "
                f"KV {c.kv_bytes_per_token / 1024:4.0f} KiB/token f16, "
                f"{c.kv_bytes_per_token_q8_0 / 1024:4.1f} q8_0 + "
                f"{c.window_bytes / 2**20:4.0f} MiB window · "
                f"~{c.decode_tps:5.1f} tok/s replies, ~{c.prefill_tps:6,.0f} tok/s reading · "
                + ("fits" if c.fits and c.quick else "fits, slow here" if c.fits else "too big")
            )
        out.result(rec, "\n".join(lines))
        return 0
    if args.action == "list":
        models = [m.__dict__ | {"kv_bytes_per_token": m.kv_bytes_per_token} for m in catalog.GEMMA4]
        embedding = catalog.EMBEDDING_GEMMA
        out.result(
            {"models": models, "embedding": embedding.__dict__},
            "\n".join(
                [f"{m.size}: {m.repo}/{m.file}" for m in catalog.GEMMA4]
                + [f"embedding: {embedding.repo}/{embedding.file} ({embedding.languages})"]
            ),
        )
        return 0
    data_dir = data_dir_of(args)
    if args.action == "get":
        family = args.family.lower()
        if family in ("embeddinggemma", "embedding-gemma", "embedding"):
            embedding = catalog.EMBEDDING_GEMMA
            return _download(data_dir, embedding.repo, embedding.file, args, out, "embedding_model")
        if family not in ("gemma-4", "gemma4"):
            raise InputError(
                "The catalog holds Gemma 4 (galahad models get gemma-4) and the router's "
                "embedding model (galahad models get embeddinggemma)."
            )
        size = args.size
        if size is None:
            rec = catalog.recommend()
            if rec.recommended is None:
                raise InputError(f"{rec.reason} Choose one anyway with --size.")
            size = rec.recommended
            out.info(rec.reason)
        chosen = catalog.model_for(size)
        repo, filename = chosen.repo, chosen.file
        projector = chosen.projector if args.vision else None
    else:
        repo, filename = args.repo_id, args.filename
        projector = None
    return _download(data_dir, repo, filename, args, out, projector=projector)


def _download(
    data_dir: Path,
    repo: str,
    filename: str,
    args: argparse.Namespace,
    out: Output,
    setting: str = "model_path",
    projector: str | None = None,
) -> int:
    from galahad_desktop.models.hub import download_gguf
    from galahad_desktop.paths import ensure_private_dir
    from galahad_desktop.settings import Settings

    ensure_private_dir(data_dir)
    revision = getattr(args, "revision", None)
    with command_job(out, "downloading", unit="bytes") as job:
        done = download_gguf(repo, filename, data_dir / "models", revision=revision, job=job)
    vision = None
    if projector:
        # Its own folder: a projector is found next to its model, one per folder.
        with command_job(out, "downloading the projector", unit="bytes") as job:
            vision = download_gguf(
                repo, projector, data_dir / "models" / "projectors", revision=revision, job=job
            )
    if args.use:
        changes = {setting: str(done.path)}
        if vision is not None:
            changes["projector"] = str(vision.path)
        Settings(data_dir).update(changes)
    out.result(
        {
            "repo": repo,
            "file": filename,
            "path": str(done.path),
            "sha256": done.sha256,
            "bytes": done.size,
            "resumed_from": done.resumed_from,
            "in_use": bool(args.use),
            "projector": None
            if vision is None
            else {"path": str(vision.path), "sha256": vision.sha256, "bytes": vision.size},
        },
        f"Downloaded {done.path} ({done.size / 1e6:,.0f} MB, SHA-256 verified)"
        + (
            f", and its vision projector {vision.path.name} ({vision.size / 1e6:,.0f} MB)"
            if vision is not None
            else ""
        )
        + (
            (
                " and made it the router's embedding model."
                if setting == "embedding_model"
                else " and made it the model in use."
            )
            if args.use
            else "."
        ),
    )
    return 0


def cmd_settings(args: argparse.Namespace, out: Output) -> int:
    from galahad_desktop.paths import ensure_private_dir
    from galahad_desktop.settings import SETTINGS, Settings

    data_dir = data_dir_of(args)
    if args.changes:
        from galahad_desktop.memory.galahad import Galahad

        changes = parse_pairs(args.changes)
        Galahad.check_settings(changes)
        ensure_private_dir(data_dir)
        settings = Settings(data_dir)
        before = settings.as_dict()
        runtime = settings.update(changes)
        note = " Stored blocks will be re-read once on next use." if runtime else ""
        changed = {k: v for k, v in settings.as_dict().items() if before[k] != v}
        out.result(
            {"settings": settings.as_dict(), "changed": changed, "runtime_changed": runtime},
            f"Saved.{note}",
        )
        return 0
    settings = Settings(data_dir)
    values = settings.as_dict()
    lines = [f"{s.key} = {values[s.key]!r}  # {s.description}" for s in SETTINGS]
    lines += [f"warning: {p}" for p in settings.problems]
    out.result({"settings": values, "problems": settings.problems}, "\n".join(lines))
    return 0


def cmd_gui(args: argparse.Namespace, out: Output) -> int:
    from galahad_desktop.ui.app import run_app

    # --set is honoured by the window too (it was accepted and ignored).
    overrides = parse_pairs(args.set)
    return int(run_app(data_dir=args.data_dir, model_path=args.model, overrides=overrides))


def register(add: Any) -> None:
    add("info", "the model, its turn format, runtime fingerprint and backend", cmd_info)
    p = add(
        "models",
        "the right Gemma 4 for this machine: recommend, get (download and verify), list; "
        "or download any GGUF from the Hugging Face Hub",
        cmd_models,
        core=False,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        q: argparse.ArgumentParser = actions.add_parser(name, help=help_text, description=help_text)
        add_common(q, suppress=True)
        return q

    q = action("recommend", "the largest Gemma 4 that fits this machine, with the others")
    q.add_argument("--n-ctx", type=int, default=8192, help="context to plan for")
    q.add_argument(
        "--measure",
        action="store_true",
        help="measure this machine's speed again (it is measured once and kept)",
    )
    q = action(
        "get",
        "download a Gemma 4, or the router's embedding model (embeddinggemma), from the "
        "catalog (SHA-256 checked against the Hub)",
    )
    q.add_argument("family", nargs="?", default="gemma-4", help="gemma-4 or embeddinggemma")
    q.add_argument("--size", help="E2B, E4B, 26B-A4B or 31B (default: the recommended one)")
    q.add_argument("--use", action="store_true", help="make it the model in settings")
    q.add_argument(
        "--vision",
        action="store_true",
        help="also download its projector (mmproj), to read pictures and scans (and, on E2B "
        "and E4B, hear voice memos)",
    )
    action("list", "the Gemma 4 catalog")
    q = action("download", "download any GGUF from the Hugging Face Hub")
    q.add_argument("repo_id")
    q.add_argument("filename")
    q.add_argument("--revision")
    q.add_argument("--use", action="store_true", help="make it the model in settings")
    p = add("settings", "show settings, or change them with KEY=VALUE", cmd_settings, core=False)
    p.add_argument("changes", nargs="*", metavar="KEY=VALUE")
    add("gui", "open the desktop window", cmd_gui, core=False)
    p = add(
        "serve-device",
        "serve this computer's CPU as a llama.cpp RPC device on 127.0.0.1 (for --set "
        "rpc_servers=127.0.0.1:PORT; the protocol has no encryption, so loopback only)",
        cmd_serve_device,
        core=False,
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50052)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
