"""The hostile-input harness: issue #34's findings replayed against the real `galahad` command.

`python -m galahad_dev eval redteam [--trials N]` runs every kind of input the fourth outside
red team used — chat messages with arithmetic and stray bytes, sampling flags, settings values
and settings files that are not files, paths under a user that does not exist, loopback
services that are not llama.cpp's device server (closing, stalling, answering garbage or
HTTP), MCP tool servers that send too much or nest too deep (and one whose background child
must not outlive it), the local server's hostile clients (redteam_server.py), and kill -9 at random
moments of `backup` and `restore` followed by the next start and `audit` — and counts what
a user must never see: internal errors (exit 70, a traceback, a 5xx), aborts (a signal, exit
134), hangs (or an answer past its bound), lock-outs, temporary folders left behind, empty
conversations, and anything stored that changed. The suite runs it scaled down, without the
server's area (`tests/test_hardening.py`; the fast tier's tests/test_server_hostile.py has
those clients); docs/reliability.md has the table of a whole run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from galahad_dev import hostile_mcp_server
from galahad_dev.hardening import kill_after
from galahad_dev.redteam_server import server_clients

Log = Callable[[str], None]
Arg = str | bytes
TIMEOUT_S = 90.0  # a model command on a busy 2-core machine; longer is a hang
SILENT_MARKERS = (b"Traceback (most recent call last)", b"Internal error")
# So `keys export` reaches its path check instead of asking for a passphrase.
ENV = {**os.environ, "GALAHAD_RECOVERY_PASSPHRASE": "a throwaway harness passphrase 7731"}

ARITHMETIC = (
    "What is 0**-1?",
    "What is 0^-1?",
    "What is 0.0**-1?",
    "What is (1-1)**-2?",
    "What is ((((1/999999)**64)**64)**64)**64?",
    "What is 9**9**9**9?",
    "What is 1e308*1e308?",
    "What is -(2**1024) / 0.0?",
)
BYTES = (b"bad\xffbyte", b"\xed\xa0\x80 lone surrogate", b"trailing \xc3", b"nul \x00 inside")
SAMPLING = (
    ("--seed", "-1"),
    ("--seed", "1180591620717411303424"),
    ("--temperature", "nan"),
    ("--temperature", "inf"),
    ("--temperature", "-1"),
    ("--max-tokens", "0"),
    ("--max-tokens", "-3"),
    ("--max-tokens", "1000000000000"),
)
SETTINGS = (
    "temperature=nan",
    "seed=-1",
    "n_threads=100000",
    "n_ctx=99999999999",
    "projector=/etc/shadow",
    "projector=/dev/zero",
    "rpc_servers=8.8.8.8:50052",
    "rpc_servers=garbage",
    "model_path=~nosuchuser/model.gguf",
    "embedding_model=~nosuchuser/minilm.gguf",
)
SETTINGS_FILES = ("fifo", "dev-zero", "huge", "not-json", "wrong-types")
DEVICE_BEHAVIOURS = ("close", "stall", "garbage", "http")
NO_SUCH_HOME = "~nosuchuser-galahad/x"


class FakeService:
    """A loopback service that is not llama.cpp's device server: it closes at once, stays
    silent, answers garbage or answers HTTP (bounded: it stops when closed)."""

    def __init__(self, behaviour: str, connections: int = 8) -> None:
        self.behaviour = behaviour
        self.connections = connections
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(30)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            for _ in range(self.connections):  # each probe gets the same answer
                conn, _ = self.sock.accept()
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            if self.behaviour == "stall":
                time.sleep(1.5)
            elif self.behaviour == "garbage":
                conn.sendall(os.urandom(64))
            elif self.behaviour == "http":
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            elif self.behaviour == "old":
                conn.recv(64)
                conn.sendall(struct.pack("<Q", 28) + bytes([3, 0, 0, 0]) + bytes(24))

    def close(self) -> None:
        self.sock.close()


@dataclass
class Outcome:
    area: str
    name: str
    code: int | None  # None: it hung (killed at the timeout)
    said: str  # the last line the user saw
    verdict: str  # answered | refused | internal | abort | hang | silent
    seconds: float


@dataclass
class Harness:
    root: Path
    log: Log
    outcomes: list[Outcome] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def command(self, args: Sequence[Arg], data_dir: bool = True) -> list[Arg]:
        base: list[Arg] = [sys.executable, "-m", "galahad_desktop.cli"]
        if data_dir:
            base += ["--data-dir", str(self.data), "--set", "n_ctx=2048"]
        return [*base, *args]

    def run(
        self,
        area: str,
        name: str,
        args: Sequence[Arg],
        stdin: bytes | None = None,
        data_dir: bool = True,
    ) -> Outcome:
        started = time.monotonic()
        try:
            proc = subprocess.run(
                self.command(args, data_dir),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=TIMEOUT_S,
                env=ENV,
            )
        except subprocess.TimeoutExpired:
            outcome = Outcome(area, name, None, "", "hang", time.monotonic() - started)
        else:
            text = proc.stdout + proc.stderr
            lines = [ln for ln in proc.stderr.decode(errors="replace").splitlines() if ln.strip()]
            said = lines[-1] if lines else proc.stdout.decode(errors="replace").strip()[-200:]
            if proc.returncode < 0 or proc.returncode == 134:
                verdict = "abort"
            elif proc.returncode == 70 or any(m in text for m in SILENT_MARKERS):
                verdict = "internal"
            elif proc.returncode == 0:
                verdict = "answered"
            else:
                verdict = "refused" if said else "silent"
            outcome = Outcome(
                area, name, proc.returncode, said[:240], verdict, time.monotonic() - started
            )
        self.outcomes.append(outcome)
        if outcome.verdict in ("internal", "abort", "hang", "silent"):
            self.findings.append(f"{area}/{name}: {outcome.verdict} ({outcome.said})")
        self.log(f"{area:9} {name[:48]:48} {outcome.verdict:9} exit {outcome.code}")
        return outcome

    def json(self, *args: str) -> dict[str, Any]:
        proc = subprocess.run(
            self.command([*args, "--json"]), capture_output=True, text=True, timeout=TIMEOUT_S
        )
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"galahad {' '.join(args)}: {proc.stderr.strip()[-300:]}")
        result: dict[str, Any] = json.loads(proc.stdout)
        return result

    # -- what must hold after every area -------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """What is stored, read through the core in this process (as a start of the app
        would read it) without loading the model: each conversation's messages, and the
        settings file's bytes."""
        from galahad_desktop.memory.galahad import Galahad

        core = Galahad(self.data)
        try:
            rows = core.vault.records.conversations()
            counts = {r["id"]: r["n_messages"] or 0 for r in rows}
            shown = {c: [(m.role, m.text) for m in core.messages(c)] for c in counts}
        finally:
            core.close()
        settings = self.data / "settings.json"
        return {
            "conversations": counts,
            "shown": shown,
            "settings": settings.read_bytes() if settings.is_file() else None,
        }

    def check(self, area: str, before: dict[str, Any]) -> dict[str, Any]:
        now = self.snapshot()
        empty = [c for c, n in now["conversations"].items() if not n]
        if empty:
            self.findings.append(f"{area}: {len(empty)} empty conversation(s) left behind")
        for conversation, text in before["shown"].items():
            if now["shown"].get(conversation) != text:
                self.findings.append(f"{area}: conversation {conversation} changed or was lost")
        if before["settings"] != now["settings"]:
            self.findings.append(f"{area}: settings.json changed")
        leftovers = [p.name for p in self.root.glob(".tmp-galahad-*")]
        leftovers += [p.name for p in self.root.glob(".galahad-restore-*")]
        if leftovers:
            self.findings.append(f"{area}: temporary folders left: {leftovers}")
        problems = self.json("audit")["problems"]
        if problems:
            self.findings.append(f"{area}: audit problems {problems}")
        return {
            "empty_conversations": len(empty),
            "leftover_folders": len(leftovers),
            "audit_problems": len(problems),
        }


# -- the areas ---------------------------------------------------------------------------
def chat_inputs(h: Harness, pick: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
    conversation = sorted(h.snapshot()["conversations"])[0]
    for question in pick(ARITHMETIC):
        h.run("chat", f"new chat: {question}", ["chat", "--message", question, "--max-tokens", "4"])
        h.run("verified", f"check {question}", ["verified", "check", question, "4"])
    for raw in pick(BYTES):
        if b"\0" not in raw:  # a command line cannot hold a NUL; typed, it can
            h.run("chat", f"bytes {raw!r}", ["chat", "--message", raw, "--max-tokens", "4"])
            h.run(
                "chat",
                f"bytes {raw!r} in a stored chat",
                ["chat", "--conversation", conversation, "--message", raw],
            )
        typed = raw + b"\n/quit\n"
        h.run("chat", f"bytes {raw!r} typed", ["chat", "--max-tokens", "2"], stdin=typed)
    h.run("chat", "/quit at once", ["chat"], stdin=b"/quit\n")
    for flag, value in pick(SAMPLING):
        h.run("flags", f"{flag} {value}", ["chat", "--message", "Hello", flag, value])


def settings_values(h: Harness, pick: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
    for value in pick(SETTINGS):
        h.run("settings", value, ["settings", value])


def settings_files(h: Harness, pick: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
    path = h.data / "settings.json"
    kept = path.read_bytes() if path.is_file() else None
    for kind in pick(SETTINGS_FILES):
        path.unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dev-zero":
            path.symlink_to("/dev/zero")
        elif kind == "huge":
            path.write_bytes(b'{"theme": "' + b"x" * (3 << 20) + b'"}')
        elif kind == "not-json":
            path.write_bytes(b"{not json")
        else:
            path.write_text('{"temperature": "nan", "n_ctx": 1e12, "seed": -5, "theme": 3}')
        h.run("file", f"settings.json {kind}: settings", ["settings"])
        h.run("file", f"settings.json {kind}: list", ["list"])
    path.unlink(missing_ok=True)
    if kept is not None:
        path.write_bytes(kept)


def paths(h: Harness, pick: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
    conversation = sorted(h.snapshot()["conversations"])[0]
    cases: list[tuple[str, list[Arg], bool]] = [
        ("--data-dir", ["--data-dir", NO_SUCH_HOME, "list"], False),
        ("backup", ["backup", NO_SUCH_HOME], True),
        ("restore", ["restore", NO_SUCH_HOME], True),
        ("export --out", ["export", conversation, "--out", NO_SUCH_HOME], True),
        ("keys export", ["keys", "export", "--out", NO_SUCH_HOME], True),
        ("keys import", ["keys", "import", NO_SUCH_HOME], True),
        ("deposit", ["deposit", NO_SUCH_HOME], True),
    ]
    for name, args, with_data in pick(cases):
        h.run("paths", name, args, data_dir=with_data)


def device_servers(h: Harness, pick: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
    for behaviour in pick(DEVICE_BEHAVIOURS):
        service = FakeService(behaviour)
        try:
            endpoint = service.endpoint
            h.run("device", f"{behaviour}: settings", ["settings", f"rpc_servers={endpoint}"])
            h.run("device", f"{behaviour}: info", ["--set", f"rpc_servers={endpoint}", "info"])
            h.run(
                "device",
                f"{behaviour}: chat",
                [
                    "--set",
                    f"rpc_servers={endpoint}",
                    "chat",
                    "--message",
                    "Hi",
                    "--max-tokens",
                    "2",
                ],
            )
        finally:
            service.close()


# Issue #60's hostile stdio MCP servers (galahad_dev/hostile_mcp_server.py): each is
# refused, named, within seconds; the well-behaved one with a background child answers.
MCP_SERVERS = (
    ("endless",),
    ("describe", "100"),
    ("deep", "900"),
    ("deep", "100000"),
    ("tools", "5000"),
    ("child", "{pid_file}"),
)


def tool_servers(h: Harness, pick: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
    """`tools show` on each hostile server: refused or answered, never a traceback or a
    hang; and a background child the server started is gone once `show` is done."""
    for number, words in enumerate(pick(MCP_SERVERS)):
        pid_file = h.root / f"mcp-child-{number}.pid"
        argv = [sys.executable, hostile_mcp_server.__file__]
        argv += [w.format(pid_file=pid_file) for w in words]
        name = f"hostile{number}"
        h.run("tools", f"add {' '.join(words[:1])}", ["tools", "add", name, "--", *argv])
        h.run("tools", f"show {' '.join(words)}", ["tools", "show", name])
        h.run("tools", f"remove {words[0]}", ["tools", "remove", name])
        if pid_file.exists():
            pid = int(pid_file.read_text())
            with contextlib.suppress(FileNotFoundError):
                if "State:\tZ" not in Path(f"/proc/{pid}/status").read_text():
                    h.findings.append(f"tools/{words[0]}: its background child {pid} outlived show")
                    os.kill(pid, 9)


def kill_trials(h: Harness, trials: int, rng: random.Random) -> None:
    """kill -9 `backup` and `restore` at random moments; the next start and `audit` must
    leave no temporary folder, no phantom backup and nothing lost."""
    good = h.root / "good-backup"
    durations: dict[str, float] = {}
    started = time.monotonic()
    h.json("backup", str(good))
    durations["backup"] = time.monotonic() - started
    started = time.monotonic()
    h.json("restore", str(good))  # the same contents: what is stored stays as it was
    durations["restore"] = time.monotonic() - started
    for trial in range(trials):
        operation = ("backup", "restore")[trial % 2]
        target = str(h.root / f"backup-{trial}") if operation == "backup" else str(good)
        # Past the interpreter's start (about a third of the whole), up to the end.
        delay = durations[operation] * rng.uniform(0.35, 1.0)
        killed, _code = kill_after([str(a) for a in h.command([operation, target])], delay)
        h.run("kill", f"{operation} {'killed' if killed else 'done'} at {delay:.2f}s", ["list"])
    # A key rotation names every backup made under the old key: each must exist.
    named = h.json("keys", "rotate").get("backups_needing_retired", [])
    phantom = [b for b in named if not Path(str(b)).exists()]
    if phantom:
        h.findings.append(f"kill: backup records without a backup: {phantom}")


def redteam(
    trials: int, seed: int, log: Log, per_kind: int | None = None, server: bool = True
) -> dict[str, Any]:
    """Run every area (with `per_kind`, that many inputs of each kind, chosen by `seed`;
    `server`: with the local server's hostile clients, a minute and a half) and count what
    went wrong."""
    if os.environ.get("GALAHAD_KEYRING_READY") != "1":
        raise RuntimeError(
            "The harness makes and abandons master keys: run it in a throwaway keyring "
            "(scripts/with-keyring.sh, which `python -m galahad_dev eval redteam` uses)."
        )
    rng = random.Random(seed)

    def pick(items: Sequence[Any]) -> Sequence[Any]:
        if per_kind is None:
            return items
        return rng.sample(list(items), min(per_kind, len(items)))

    root = Path(tempfile.mkdtemp(prefix="galahad-redteam-"))
    h = Harness(root, log)
    checks: dict[str, dict[str, int]] = {}
    try:
        h.json("chat", "--message", "The code word is ember. Say hello.", "--max-tokens", "6")
        for name, area in (
            ("chat", chat_inputs),
            ("settings", settings_values),
            ("files", settings_files),
            ("paths", paths),
            ("device", device_servers),
            ("tools", tool_servers),
            *([("server", server_clients)] if server else []),
        ):
            before = h.snapshot()
            area(h, pick)
            checks[name] = h.check(name, before)
        before = h.snapshot()
        kill_trials(h, trials, rng)
        checks["kill"] = h.check("kill", before)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    verdicts = Counter(o.verdict for o in h.outcomes)
    by_area: dict[str, dict[str, int]] = {}
    for o in h.outcomes:
        by_area.setdefault(o.area, Counter())[o.verdict] += 1
    return {
        "command": "eval redteam",
        "seed": seed,
        "runs": len(h.outcomes),
        "internal_errors": verdicts["internal"],
        "aborts": verdicts["abort"],
        "hangs": verdicts["hang"],
        "silent_failures": verdicts["silent"],  # for the server: an error not in JSON
        "lock_outs": verdicts["lockout"],
        "empty_conversations": sum(c["empty_conversations"] for c in checks.values()),
        "leftover_folders": sum(c["leftover_folders"] for c in checks.values()),
        "audit_problems": sum(c["audit_problems"] for c in checks.values()),
        "findings": h.findings,
        "by_area": {area: dict(v) for area, v in by_area.items()},
        "results": [o.__dict__ for o in h.outcomes],
    }
