"""`python -m galahad_dev bench|eval ...`: measurements that need a checkout.

Results are printed (one JSON object with --json) and saved under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from galahad_desktop.cli.common import parse_pairs
from galahad_desktop.errors import InputError
from galahad_desktop.system.files import read_regular_file
from galahad_dev import bench
from galahad_dev.bench import Run, parse_sizes

GENERATED = "generated"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m galahad_dev")
    parser.add_argument("--model", type=Path, help="GGUF model (default: the embedded one)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="development benchmarks")
    bench.add_argument(
        "kind",
        choices=[
            "resume",
            "deposit",
            "kv-quality",
            "persist",
            "pickle",
            "plot",
            "storage",
            "grammar",
            "stack",
        ],
    )
    bench.add_argument(
        "--sizes",
        default=None,
        help="token counts, comma-separated (default 1000,4000,16000; stack: each document's, "
        "default 1000,3000; kv-quality: the first is the tokens read)",
    )
    bench.add_argument("--reps", type=int, default=3, help="repetitions (medians are reported)")
    bench.add_argument(
        "--kv-types", default="f16,q8_0", help="resume, deposit: KV cache types, side by side"
    )
    bench.add_argument("--window", type=int, default=256, help="kv-quality: tokens predicted")
    bench.add_argument("--text", type=Path, help="kv-quality: a held-out text (default: generated)")
    bench.add_argument(
        "--image",
        nargs="?",
        const=GENERATED,
        metavar="PICTURE",
        help="resume: one picture (default: a generated photo) restored from its block against "
        "the vision encoder and prefill again (needs a model with a vision projector)",
    )
    bench.add_argument(
        "--audio",
        nargs="?",
        const=GENERATED,
        metavar="MEMO",
        help="resume: one voice memo (default: 60 s spoken by espeak-ng) restored from its "
        "blocks against the audio encoder and prefill again (needs a projector that hears)",
    )
    bench.add_argument("--turns", type=int, default=3, help="persist, storage: turns per chat")
    bench.add_argument(
        "--shapes",
        default="E2B,E4B,26B-A4B,31B",
        help="storage: the Gemma 4 sizes whose attention shapes are measured",
    )
    bench.add_argument("--documents", default="2,3,5", help="stack: how many documents are stacked")
    bench.add_argument(
        "--ks", default="0,16,32", help="stack: each block's first tokens recomputed (0: none)"
    )
    bench.add_argument(
        "--blend",
        default="",
        help="stack: CacheBlend's ceiling at these shares of the cells (e.g. 0.05,0.15)",
    )
    bench.add_argument(
        "--stack-shapes",
        default="",
        help="stack: these Gemma 4 sizes' shapes instead of the real models (random weights: "
        "bytes and times only; saved as bench-stack-shapes)",
    )
    bench.add_argument("--seed", type=int, default=0, help="stack: the generated documents")
    bench.add_argument(
        "--questions", type=int, default=40, help="stack: needle questions (not the first document)"
    )
    bench.add_argument("--doc", type=int, default=3000, help="storage: a document's tokens")
    bench.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=Path("benchmarks/results/bench-resume.json"),
        help="plot: the bench resume JSON to draw",
    )
    ev = sub.add_parser("eval", help="evaluations (throwaway data dirs)")
    ev.add_argument(
        "kind",
        choices=[
            "needles",
            "memory",
            "routing",
            "across",
            "tamper",
            "catalog",
            "crashes",
            "hostile",
            "redteam",
            "flywheel",
            "import",
            "destinations",
        ],
    )
    ev.add_argument("--tokens", type=int, default=200_000, help="memory: tokens to deposit")
    ev.add_argument("--probes", type=int, default=50, help="memory: routed questions")
    ev.add_argument("--doc-tokens", type=int, default=12_000, help="memory: tokens per document")
    ev.add_argument("--problems", type=int, default=30, help="flywheel: problems")
    ev.add_argument("--attempts", type=int, default=5, help="flywheel: best-of-N first solve")
    ev.add_argument(
        "--oracle",
        action="store_true",
        help="flywheel: store the verifier's answer when the model fails",
    )
    ev.add_argument(
        "--mutations", type=int, default=1000, help="tamper, catalog, import: mutations to try"
    )
    ev.add_argument("--trials", type=int, default=30, help="crashes, redteam: kill trials")
    ev.add_argument("--blocks", type=int, default=64)
    ev.add_argument("--block-tokens", type=int, default=2000)
    ev.add_argument("--controls", type=int, default=None, help="16 (needles), 20 (memory)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument(
        "--embedding-model",
        type=Path,
        default=None,
        help="routing: GGUF embedding model (default: the suite's all-MiniLM-L6-v2)",
    )
    ev.add_argument(
        "--no-rerank",
        action="store_true",
        help="routing: retrieval alone (the model reranker reads every document first)",
    )
    ev.add_argument(
        "--rerank-only",
        choices=["lexical", "hybrid"],
        default=None,
        help="routing: the model checks this method's candidates alone (default: both)",
    )
    ev.add_argument(
        "--ledgers", type=int, default=None, help="routing, across: generated ledgers (4, 8)"
    )
    ev.add_argument("--pairs", type=int, default=24, help="across: two-document questions")
    ev.add_argument(
        "--vector-cache",
        action="store_true",
        help="routing: passage vectors from the checked cache beside the documents (the suite)",
    )
    ev.add_argument(
        "--documents",
        default="",
        help="routing: only these documents (comma-separated names) and their questions",
    )
    return parser


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure(
    args: argparse.Namespace, sizes: list[int], overrides: dict[str, Any]
) -> tuple[str, dict[str, Any], str]:
    """bench resume|deposit|kv-quality: the app's restore and reading against plain
    llama.cpp on this machine, in a throwaway data directory."""
    kv_types = tuple(k.strip() for k in args.kv_types.split(",") if k.strip())
    if any(k not in ("f16", "q8_0", "q4_0") for k in kv_types) or not kv_types:
        raise InputError("--kv-types takes f16, q8_0, q4_0 (comma-separated).")
    if (args.image is not None or args.audio is not None) and args.kind != "resume":
        raise InputError("--image and --audio go with `bench resume`.")
    if args.audio is not None:
        memo = None if args.audio == GENERATED else Path(args.audio)
        result = bench.bench_audio(args.reps, Run(args.model, overrides, log), memo)
        return "bench-resume-audio", result, bench.audio_table(result)
    if args.image is not None:
        picture = None if args.image == GENERATED else Path(args.image)
        result = bench.bench_picture(args.reps, Run(args.model, overrides, log), picture)
        return "bench-resume-image", result, bench.picture_table(result)
    if args.kind == "resume":
        result = bench.bench_resume(sizes, args.reps, Run(args.model, overrides, log), kv_types)
        return "bench-resume", result, bench.resume_table(result)
    if args.kind == "deposit":
        result = bench.bench_deposit(sizes, args.reps, Run(args.model, overrides, log), kv_types)
        return "bench-deposit", result, bench.deposit_table(result)
    source = None
    if args.text is not None:
        source = read_regular_file(args.text, 64 * 2**20, "a text").decode("utf-8", "replace")
    result = bench.bench_kv_quality(sizes[0], args.window, Run(args.model, overrides, log), source)
    return "bench-kv-quality", result, bench.quality_table(result)


def bench_stack_kind(
    args: argparse.Namespace, overrides: dict[str, Any]
) -> tuple[str, dict[str, Any], str]:
    """bench stack: Gemma 3 270M and the Gemma 4 test model (or --model alone), or with
    --stack-shapes the random-weight GGUFs of real sizes (block bytes and move times)."""
    from galahad_desktop.paths import default_model_path
    from galahad_dev.bench_stack import bench_stack, table
    from galahad_dev.gemma4_model import build
    from galahad_dev.real_shapes import real_shape_model

    embedded = default_model_path()
    try:
        counts = [int(n) for n in args.documents.split(",") if n.strip()]
        ks = [int(k) for k in args.ks.split(",") if k.strip()]
        blend = [float(x) for x in args.blend.split(",") if x.strip()]
    except ValueError:
        raise InputError(
            "--documents and --ks take whole numbers, --blend shares, comma-separated."
        ) from None
    if not counts or min(counts) < 1 or not ks or min(ks) < 0:
        raise InputError("--documents needs counts of 1 or more, --ks counts of 0 or more.")
    if args.stack_shapes:
        models = {}
    elif args.model is not None:
        models = {args.model.name: Run(args.model, overrides, log)}
    else:
        models = {
            "Gemma 3 270M": Run(None, overrides, log),
            "Gemma 4 test model": Run(build(embedded), overrides, log),
        }
    answers = {label: True for label in models}
    for size in [s.strip() for s in args.stack_shapes.split(",") if s.strip()]:
        label = f"Gemma 4 {size} shape"
        models[label] = Run(real_shape_model(size, embedded), overrides, log)
        answers[label] = False  # random weights, narrow: only bytes and times mean anything
    sizes = parse_sizes(args.sizes or "1000,3000")
    if any(not 0 < x <= 1 for x in blend):
        raise InputError("--blend takes shares of the cells between 0 and 1 (e.g. 0.05,0.15).")
    result = bench_stack(models, counts, sizes, ks, args.seed, log, answers, args.questions, blend)
    return "bench-stack-shapes" if args.stack_shapes else "bench-stack", result, table(result)


def model_eval(args: argparse.Namespace, run: Run) -> dict[str, Any] | None:
    """The evaluations on a model (None: the kind is one of the fuzzers)."""
    if args.kind == "needles":
        from galahad_dev.needles import eval_needles

        controls = 16 if args.controls is None else args.controls
        return eval_needles(args.blocks, args.block_tokens, controls, args.seed, run)
    if args.kind == "memory":
        from galahad_dev.memory_eval import eval_memory

        controls = 20 if args.controls is None else args.controls
        return eval_memory(args.tokens, args.probes, controls, args.doc_tokens, args.seed, run)
    if args.kind == "routing":
        from galahad_dev.routing_eval import eval_routing

        only = [d for d in args.documents.split(",") if d]
        return eval_routing(
            run,
            embedding_model=args.embedding_model,
            rerank=not args.no_rerank,
            only=only,
            rerank_only=args.rerank_only,
            ledgers=4 if args.ledgers is None else args.ledgers,
            vector_cache=args.vector_cache,
        )
    if args.kind == "across":
        from galahad_dev.across_eval import eval_across

        ledgers = 8 if args.ledgers is None else args.ledgers
        return eval_across(run, ledgers, args.pairs, args.seed)
    if args.kind == "flywheel":
        from galahad_dev.flywheel import eval_flywheel

        return eval_flywheel(args.problems, args.attempts, args.seed, run, oracle=args.oracle)
    return None


def run(args: argparse.Namespace) -> tuple[str, dict[str, Any], str]:
    overrides = parse_pairs(args.set)
    if args.command == "bench":
        from galahad_dev import peers

        if args.kind == "plot":
            result = json.loads(args.source.read_text())
            path = args.source.with_suffix(".png")
            if not peers.plot_resume(result, path):
                raise SystemExit("No plot: install the 'bench' extra (matplotlib).")
            return "bench-plot", {"plot": str(path)}, f"wrote {path}"
        if args.kind == "storage":
            from galahad_desktop.paths import default_model_path
            from galahad_dev.bench_storage import bench_storage, table

            shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
            kv_types = tuple(k.strip() for k in args.kv_types.split(",") if k.strip())
            result = bench_storage(
                shapes, args.doc, args.turns, args.reps, default_model_path(), log, kv_types
            )
            return "bench-storage", result, table(result)
        if args.kind == "stack":
            return bench_stack_kind(args, overrides)
        if args.kind == "grammar":
            from galahad_desktop.paths import default_model_path
            from galahad_dev.bench_grammar import bench_grammar, table
            from galahad_dev.gemma4_model import build

            embedded = default_model_path()
            models = {"Gemma 3 270M": embedded, "Gemma 4 test model": build(embedded)}
            result = bench_grammar(models, args.reps, 160)
            return "bench-grammar", result, table(result)
        sizes = parse_sizes(args.sizes or "1000,4000,16000")
        if args.kind in ("resume", "deposit", "kv-quality"):
            return measure(args, sizes, overrides)
        if args.kind == "persist":
            result = peers.bench_persist(sizes, args.turns, args.model, overrides, log)
            text = json.dumps(result["summary"], indent=1)
        else:
            result = peers.bench_pickle(sizes, args.reps, args.model, overrides, log)
            text = json.dumps(result["results"], indent=1)
        return f"bench-{args.kind}", result, text
    found = model_eval(args, Run(args.model, overrides, log))
    if found is not None:
        result = found
    else:
        from galahad_dev import hardening

        if args.kind == "tamper":  # both fuzzers: the block files and the catalog
            from galahad_dev.catalog_fuzz import catalog_fuzz

            result = {
                "command": "eval tamper",
                "blocks": hardening.tamper_fuzz(args.mutations, args.seed, log),
                "catalog": catalog_fuzz(args.mutations, args.seed, log),
            }
            for part in ("blocks", "catalog"):
                for key, value in result[part].items():
                    if isinstance(value, int | bool) and key not in ("seed",):
                        result[f"{part}_{key}"] = value
        elif args.kind == "catalog":
            from galahad_dev.catalog_fuzz import catalog_fuzz

            result = catalog_fuzz(args.mutations, args.seed, log)
        elif args.kind == "import":
            from galahad_dev.import_fuzz import import_fuzz

            result = import_fuzz(args.mutations, args.seed, log)
        elif args.kind == "destinations":
            from galahad_dev.destinations import destination_matrix

            result = destination_matrix(log)
        elif args.kind == "crashes":
            result = hardening.crash_trials(args.trials, args.seed, log)
        elif args.kind == "redteam":
            from galahad_dev.redteam import redteam

            result = redteam(args.trials, args.seed, log)
        else:
            result = hardening.eval_hostile(log)
    summary = {k: v for k, v in result.items() if not isinstance(v, list | dict)}
    return f"eval-{args.kind}", result, json.dumps(summary, indent=1, default=str)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (
        args.command == "eval"
        and args.kind in ("crashes", "redteam")
        and not os.environ.get("GALAHAD_KEYRING_READY")
    ):
        # Crash trials create, rotate and abandon master keys: never in the user's own
        # keyring. Run again inside a throwaway one (a private D-Bus and gnome-keyring).
        script = Path(__file__).resolve().parents[1] / "scripts" / "with-keyring.sh"
        command = [str(script), sys.executable, "-m", "galahad_dev", *(argv or sys.argv[1:])]
        os.execv(str(script), command)
    name, result, text = run(args)
    if name == "bench-plot":  # a drawing of a saved result, not a result of its own
        print(json.dumps(result) if args.json else text)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    # One file per measurement, replaced by each run (git keeps the history).
    path = args.out / f"{name}.json"
    result["saved_to"] = str(path)
    result["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    result.setdefault("stamp", bench.stamp(result.get("fingerprint")))
    path.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, default=str) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
