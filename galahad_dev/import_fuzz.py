"""The import fuzzer: valid exports of every format, each mutated once, imported into a
throwaway core (the fast tier's fake engine: parsing and storage are what is tested).

A mutation picks one field anywhere in the file and changes its type, removes it,
duplicates it, nests it deeper or makes it huge (for Markdown: the text itself). Every
import must end in success or a refusal naming the file and, for a wrong shape, the field
(exit 0 or 4 in the command) — never an internal error, never a hang (a time limit per file),
never a change to what was stored before when it is refused; the audit is clean at the end.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from galahad_desktop.errors import GalahadError, InputError
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.transfer import exporters
from galahad_desktop.vault.keys import MemoryKeyStore
from galahad_dev import import_samples
from galahad_dev.fake_engine import fake_factory

KINDS = ("retype", "remove", "duplicate", "nest", "huge")
TIME_LIMIT_S = 20
OTHER_VALUES: list[Any] = [
    7,
    -1,
    3.5,
    1e308,
    float("inf"),
    float("nan"),
    10**400,
    "text",
    "\ud800",
    "",
    [],
    [1, "x"],
    {},
    {"x": 1},
    None,
    True,
]


def _galahad_sample(path: Path) -> Path:
    messages = [
        exporters.ExportedMessage("user", "Wie hoch ist der Mont Blanc?", 1_700_000_000.0),
        exporters.ExportedMessage("model", "Etwa 4.806 Meter.", 1_700_000_050.0),
    ]
    path.write_text(exporters.to_json("Berge", 1_700_000_000.0, 1_700_000_050.0, messages))
    return path


SAMPLES: dict[str, Callable[[Path], Path]] = {
    "ChatGPT": lambda d: import_samples.chatgpt_export(d / "conversations.json"),
    "Open WebUI": lambda d: import_samples.open_webui_file(d / "chats.json"),
    "LM Studio": lambda d: import_samples.lm_studio_file(d / "haiku.conversation.json"),
    "Galahad": lambda d: _galahad_sample(d / "berge.json"),
    "Jan": lambda d: import_samples.jan_folder(d / "jan"),
    "Markdown": lambda d: import_samples.markdown_file(d / "tea.md"),
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*prefix, index))


def _huge(rng: random.Random) -> Any:
    return rng.choice(
        ["Ω" * 2_000_000, ["x"] * 200_000, {str(i): i for i in range(50_000)}, 10**4000]
    )


def mutate_json(data: Any, rng: random.Random) -> tuple[Any, str, str]:
    """One mutation somewhere in `data`: (new data, kind, the path changed)."""
    data = copy.deepcopy(data)
    paths = list(_paths(data))
    path = rng.choice(paths[1:] or paths)
    kind = rng.choice(KINDS)
    where = "/".join(map(str, path)) or "(the whole file)"
    if not path:
        if kind == "remove":
            return None, kind, where
        if kind == "nest":
            return [data], kind, where
        return rng.choice(OTHER_VALUES), kind, where
    parent = data
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if kind == "retype":
        current = parent[last]
        choices = [v for v in OTHER_VALUES if type(v) is not type(current)]
        parent[last] = copy.deepcopy(rng.choice(choices))
    elif kind == "remove":
        del parent[last]
    elif kind == "duplicate":
        if isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
        else:
            parent[f"{last}"] = copy.deepcopy(parent[last])
            other = rng.choice(list(parent)) if parent else last
            parent[other] = copy.deepcopy(parent[last])
    elif kind == "nest":
        value = parent[last]
        for _ in range(rng.choice([1, 3, 40, 3000])):
            value = [value] if rng.random() < 0.5 else {"x": value}
        parent[last] = value
    else:
        parent[last] = _huge(rng)
    return data, kind, where


def mutate_markdown(text: str, rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(KINDS)
    lines = text.splitlines()
    at = rng.randrange(len(lines) + 1)
    if kind == "retype":
        lines.insert(at, rng.choice(["## You", "**Gemma:**", "# ", "\x00", "\ud800", "## AI —"]))
    elif kind == "remove":
        lines = [line for line in lines if not line.startswith("##")] if rng.random() < 0.5 else []
    elif kind == "duplicate":
        lines = lines + lines
    elif kind == "nest":
        lines.insert(at, "#" * rng.choice([1, 7, 500]) + " You " + "**" * 200)
    else:
        lines.insert(at, "x" * 3_000_000)
    return "\n".join(lines), kind


def _dump(data: Any) -> str:
    # ensure_ascii: a lone surrogate is written as its \\ud800 escape, as a real export may.
    try:
        return json.dumps(data, ensure_ascii=True)
    except RecursionError:
        return "[" * 5000 + "]" * 5000


def make_case(fmt: str, folder: Path, rng: random.Random) -> tuple[Path, str, str]:
    """Write a mutated export of `fmt` under `folder`: (path to import, kind, where)."""
    path = SAMPLES[fmt](folder)
    if fmt == "Markdown":
        text, kind = mutate_markdown(path.read_text(), rng)
        path.write_text(text, errors="surrogatepass")
        return path, kind, "the text"
    if fmt == "Jan":
        threads = sorted((path / "threads").iterdir())
        thread = rng.choice(threads)
        target = thread / rng.choice(["thread.json", "messages.jsonl"])
        if target.name == "messages.jsonl":
            lines = target.read_text().splitlines()
            index = rng.randrange(len(lines))
            mutated, kind, where = mutate_json(json.loads(lines[index]), rng)
            lines[index] = _dump(mutated)
            target.write_text("\n".join(lines))
            return path, kind, f"{thread.name}/messages.jsonl line {index + 1}: {where}"
        mutated, kind, where = mutate_json(json.loads(target.read_text()), rng)
        target.write_text(_dump(mutated))
        return path, kind, f"{thread.name}/thread.json: {where}"
    mutated, kind, where = mutate_json(json.loads(path.read_text()), rng)
    path.write_text(_dump(mutated))
    return path, kind, where


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _stored(core: Galahad) -> tuple[int, int]:
    """How many conversations and messages are stored (from the records: decrypting every
    title and preview after each of a thousand imports would be most of the fuzzer's time)."""
    rows = core.vault.records.conversations()
    return len(rows), sum(r["n_messages"] or 0 for r in rows)


_NAMED = re.compile(
    r"'[^']+' should be|is not (valid )?JSON|not recognised|not UTF-8|"
    r"not a transcript|does not exist|Jan thread|at most|holds no Jan|"
    r"should be an object"
)


def import_fuzz(mutations: int, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="galahad-import-fuzz-"))
    table: dict[str, dict[str, int]] = {
        fmt: {"ok": 0, "refused": 0, "internal": 0, "hang": 0, "unnamed": 0} for fmt in SAMPLES
    }
    by_kind: dict[str, dict[str, int]] = {k: {"ok": 0, "refused": 0} for k in KINDS}
    failures: list[str] = []
    changed_on_refusal = 0
    slowest = 0.0
    core = Galahad(
        root / "data",
        keystore=MemoryKeyStore(),
        engine_factory=fake_factory(),
        overrides={"n_ctx": 4096},
    )
    try:
        core.import_conversations(SAMPLES["ChatGPT"](_fresh(root / "seed")))  # something stored
        for number in range(mutations):
            fmt = list(SAMPLES)[number % len(SAMPLES)]
            folder = _fresh(root / "case")
            path, kind, where = make_case(fmt, folder, rng)
            before = _stored(core)
            start = time.perf_counter()
            outcome = "ok"
            try:
                with _deadline(TIME_LIMIT_S):
                    core.import_conversations(path)
            except TimeoutError:
                outcome = "hang"
            except InputError as exc:
                outcome = "refused"
                if not _NAMED.search(str(exc)):
                    table[fmt]["unnamed"] += 1
                    failures.append(f"{fmt} {kind} {where}: unnamed refusal: {exc}")
                if _stored(core) != before:
                    changed_on_refusal += 1
                    failures.append(f"{fmt} {kind} {where}: stored data changed on refusal")
            except GalahadError as exc:
                outcome = "internal"
                failures.append(f"{fmt} {kind} {where}: {type(exc).__name__}: {exc}")
            except Exception as exc:  # what the fuzzer is here to find
                outcome = "internal"
                failures.append(f"{fmt} {kind} {where}: {type(exc).__name__}")
            slowest = max(slowest, time.perf_counter() - start)
            table[fmt][outcome] += 1
            if outcome in ("ok", "refused"):
                by_kind[kind][outcome] += 1
            if (number + 1) % 100 == 0:
                log(f"import fuzz: {number + 1}/{mutations}")
        audit = core.audit()
    finally:
        core.close()
        shutil.rmtree(root, ignore_errors=True)
    totals = {k: sum(row[k] for row in table.values()) for k in next(iter(table.values()))}
    return {
        "command": "eval import",
        "mutations": mutations,
        "seed": seed,
        "ok": totals["ok"],
        "refused": totals["refused"],
        "internal_errors": totals["internal"],
        "hangs": totals["hang"],
        "unnamed_refusals": totals["unnamed"],
        "changed_on_refusal": changed_on_refusal,
        "audit_problems": len(audit.problems),
        "slowest_s": round(slowest, 2),
        "time_limit_s": TIME_LIMIT_S,
        "by_format": table,
        "by_kind": by_kind,
        "failures": failures[:50],
    }


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder
