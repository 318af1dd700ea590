"""Words and numbers for the window: sizes, times, date groups, status lines."""

from __future__ import annotations

import time
from datetime import date, datetime, timedelta

from galahad_desktop.memory.results import GraftReport, TurnResult


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def keyring_label(backend: str) -> str:
    """'keyring.backends.SecretService.Keyring' -> 'SecretService'."""
    parts = [p for p in backend.split(".") if p not in ("keyring", "backends", "Keyring")]
    return parts[-1] if parts else backend


def ago(timestamp: float, now: float | None = None) -> str:
    seconds = max(0.0, (now or time.time()) - timestamp)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


GROUPS = ("Today", "Yesterday", "Previous 7 days", "Previous 30 days", "Older")


def date_group(timestamp: float, today: date | None = None) -> str:
    """The sidebar's group for a conversation last changed at `timestamp` (local time)."""
    today = today or date.today()
    day = datetime.fromtimestamp(timestamp).date()
    if day >= today:
        return "Today"
    if day == today - timedelta(days=1):
        return "Yesterday"
    if day > today - timedelta(days=8):
        return "Previous 7 days"
    if day > today - timedelta(days=31):
        return "Previous 30 days"
    return "Older"


def graft_status(report: GraftReport | None) -> str:
    if report is None or (not report.block_id and not report.fallback_reason):
        return "Ready"
    if report.fallback_reason:
        return f"Re-read {report.tokens:,} tokens: {report.fallback_reason}"
    proof = report.proof
    if proof.verdict == "exact":
        verdict = "byte-exact ✓"
    elif proof.verdict == "close":
        verdict = f"close (max Δ {proof.max_abs_delta:.0e})"
    else:
        verdict = proof.verdict
    return f"Resumed {report.restored_tokens:,} tokens in {report.restore_ms:.0f} ms · {verdict}"


def turn_status(result: TurnResult) -> str:
    library = result.library
    if library is not None and library.mode in ("recurrence", "transfer"):
        proof = "byte-exact ✓" if result.proof.verdict == "exact" else result.proof.verdict
        status = f"{library.label} · {proof}"
    elif result.graft is not None:
        status = graft_status(result.graft)
    else:
        status = "Saved"
    if result.stop_reason == "cancelled":
        status = f"Stopped · kept {result.counters.generated_tokens} tokens · {status}"
    if result.thought_tokens:
        status += (
            f" · thought for {result.thought_tokens} tokens (not kept); re-read the "
            f"{result.reread_tokens}-token answer"
        )
    return f"{status} · saved in {result.counters.persist_ms:.0f} ms"
