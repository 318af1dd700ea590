"""Words and numbers for the window: sizes, times, date groups, status lines."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import date, datetime, timedelta

from galahad_desktop.memory.results import (
    ConversationSummary,
    Counters,
    DepositResult,
    GraftReport,
    MemoryStats,
    Message,
    ToolCall,
    TurnResult,
)
from galahad_desktop.sizes import human_size


def human_bytes(n: float) -> str:
    """Sizes in the decimal units `galahad storage` and disks use (a 70 MB budget read
    66.8 MB here when this divided by 1024)."""
    return human_size(n)


def reuse_words(counters: Counters) -> str:
    """What a read took from memory and read again, said only when it happened ("restored
    0, re-read 0" said nothing)."""
    parts = []
    if counters.restored_tokens:
        parts.append(f"{counters.restored_tokens:,} tokens restored from memory")
    if counters.recomputed_tokens:
        parts.append(f"{counters.recomputed_tokens:,} read again")
    return "".join(f" · {p}" for p in parts)


def short_title(title: str, limit: int = 32) -> str:
    """A title for a line that names several: cut at a word, and said to be cut."""
    if len(title) <= limit:
        return title
    cut = title[: limit - 1].rsplit(" ", 1)[0] or title[: limit - 1]
    return cut.rstrip(" ,.;:") + "…"


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
    status = f"{status} · saved in {result.counters.persist_ms:.0f} ms"
    return f"{result.notice} · {status}" if result.notice else status


def resume_note(report: GraftReport) -> str:
    """The sidebar's note on a conversation resumed in this session."""
    if report.fallback_reason:
        return f"Re-read once ({report.tokens:,} tokens) · stored again"
    if not report.block_id:
        return ""
    mark = " · verified ✓" if report.proof.verdict == "exact" else f" · {report.proof.verdict}"
    return f"Resumed in {report.restore_ms:.0f} ms{mark}"


def memory_line(conv: ConversationSummary, resumed: str = "") -> tuple[str, str]:
    """A conversation's memory in a glance, and the palette colour it is shown in."""
    if conv.memory == "damaged" or conv.damaged:
        return "Damaged: will not open (Security → Run audit names it)", "danger"
    if resumed:
        return resumed, "success"
    if conv.memory == "stored":
        return f"Stored · {conv.n_tokens:,} tokens · {human_bytes(conv.block_bytes)}", "success"
    if conv.memory == "needs re-reading" and conv.given_back:
        return "Needs re-reading once (memory given back)", "warning"
    if conv.memory == "needs re-reading":
        return "Needs re-reading once (model or settings changed)", "warning"
    return "Not stored yet", "muted"


def proof_words(report: GraftReport | None) -> str:
    """What the proof of the last restore means, in plain words (one click from the panel)."""
    if report is None or not report.block_id:
        return (
            "No conversation has been restored yet. When one is, Galahad checks that the "
            "model is exactly where it was: it compares what the model would say next with "
            "what it said when the conversation was stored."
        )
    if report.fallback_reason:
        return (
            f"This conversation was read again instead of restored ({report.fallback_reason}). "
            f"{report.tokens:,} tokens were re-read once and stored again, so the next resume "
            "is a restore."
        )
    proof = report.proof
    head = (
        f"{report.restored_tokens:,} tokens of this conversation's memory were read from "
        f"disk, decrypted and put back in {report.restore_ms:.0f} ms; "
        f"{report.recomputed_tokens:,} were recomputed."
    )
    if proof.verdict == "exact":
        verdict = (
            "The proof is exact: when the conversation was stored, Galahad kept a fingerprint "
            "(SHA-256) of every score the model gave to its next word. After the restore it "
            "computed the scores again and the fingerprint is identical, bit for bit. The "
            "model is exactly where it was; nothing was approximated."
        )
    elif proof.verdict == "close":
        verdict = (
            "The proof is close, not exact: the model's next-word scores differ from the "
            f"stored ones by at most {proof.max_abs_delta:.1e} (KL {proof.kl:.1e}), and its "
            f"most likely next word {'is the same' if proof.argmax_agree else 'differs'}. "
            "This happens when the hardware or backend computes in a different order."
        )
    else:
        verdict = f"The proof's verdict is {proof.verdict}: {proof.describe()}."
    return f"{head}\n\n{verdict}\n\nChecking took {proof.proof_ms:.1f} ms."


def memory_summary(stats: MemoryStats) -> str:
    """The memory panel's totals (rich text): what is kept and what it saved."""
    restore_ms = sum(h.restore_ms for h in stats.history)
    prefill_ms = sum(h.prefill_ms for h in stats.history)
    recomputed = stats.recomputed_tokens_total
    per_token = prefill_ms / recomputed if recomputed else None
    saved = (
        f"≈ {(stats.restored_tokens_total * per_token - restore_ms) / 1e3:,.1f} s saved "
        "(at this machine's measured re-read speed)"
        if per_token
        else f"restore time {restore_ms / 1e3:.2f} s in total"
    )
    budget = (
        f"{human_bytes(stats.on_disk_bytes)} of the {human_bytes(stats.budget_bytes)} disk "
        "budget in use (Settings ▸ Memory and documents)<br>"
        if stats.budget_bytes
        else f"{human_bytes(stats.on_disk_bytes)} in use, no disk budget<br>"
    )
    if 0 < stats.budget_bytes < stats.on_disk_bytes:
        budget += "Over the budget: what is open or kept is larger than it.<br>"
    return (
        f"{budget}<b>{stats.blocks}</b> block{'' if stats.blocks == 1 else 's'} on disk · "
        f"{human_bytes(stats.bytes)} · "
        f"{stats.tokens_stored:,} tokens stored<br><b>{stats.restored_tokens_total:,}</b> "
        f"tokens restored instead of recomputed, {recomputed:,} recomputed · {saved}<br>"
        + (
            f"{stats.library_saved_tokens_total:,} tokens of answers taken from verified "
            "answers instead of written again"
            if stats.library_saved_tokens_total
            else "No verified answer has been reused yet"
        )
    )


def clock(seconds: float) -> str:
    """A memo's length as people say it: 0:42, 12:05, 1:02:10."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    if hours:
        return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{rest // 60}:{rest % 60:02d}"


def deposit_note(result: DepositResult) -> str:
    """The status line after a document (or a picture, or a scan) was stored."""
    seconds = result.prefill_ms / 1e3
    if result.sounds:
        parts = f" in {result.sounds} parts" if result.sounds > 1 else ""
        return (
            f"Heard voice memo '{result.name}' ({clock(result.audio_seconds)}{parts}, "
            f"{result.audio_tokens:,} audio tokens) in {seconds:.1f} s · stored · "
            f"{human_bytes(result.block_bytes)}"
        )
    if result.pictures == 1 and result.n_parts == 1:
        return (
            f"Read picture '{result.name}' ({result.image_tokens:,} tokens) in {seconds:.1f} s "
            f"· stored · {human_bytes(result.block_bytes)}"
        )
    if result.pictures:
        return (
            f"Read {result.pictures} scanned pages of '{result.name}' "
            f"({result.image_tokens:,} picture tokens) in {seconds:.1f} s · stored · "
            f"{human_bytes(result.block_bytes)}"
        )
    return (
        f"Stored '{result.name}': {result.tokens:,} tokens read in {seconds:.1f} s · "
        f"{human_bytes(result.block_bytes)}"
    )


def calls_text(calls: Sequence[ToolCall]) -> str:
    """The calls a reply made, as the window shows them."""
    made = ", ".join(f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in calls)
    return f"Called {made}" if made else ""


def message_text(message: Message, before: Message | None = None) -> str:
    """A message as the window shows it: tool results and calls in words, not as the JSON
    they are kept in (a tool message's card shows the calls it answers, `before`; its
    results fold below), a turn closed at a stopped call as a note."""
    if message.role == "tool":
        if before is not None and before.calls:
            return ", ".join(
                f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in before.calls
            )
        try:
            return ", ".join(f"↳ {r['name']}" for r in json.loads(message.text))
        except (ValueError, KeyError, TypeError):
            return message.text
    if message.role == "model" and not message.text and before and before.role == "tool":
        return "The turn ended here: the calls above were stopped."
    if not message.calls:
        return message.text
    return f"{message.text}\n\n{calls_text(message.calls)}".strip()


def message_thoughts(message: Message) -> str:
    """What a card folds: a reply's thoughts, or the results of a tool message."""
    if message.role != "tool":
        return message.thoughts
    try:
        answered = json.loads(message.text)
        if len(answered) == 1:
            return str(answered[0]["content"])
        return "\n\n".join(f"**{r['name']}**: {r['content']}" for r in answered)
    except (ValueError, KeyError, TypeError):
        return ""


def shown_roles(messages: list[Message]) -> list[str]:
    """How each message is shown: the app's own words after a document, and a turn closed
    at a stopped call, are notes, not turns; tool results are tool cards."""

    def note(i: int) -> bool:
        if not i or messages[i].role != "model":
            return False
        before = messages[i - 1].role
        return before == "document" or (before == "tool" and not messages[i].text)

    return ["note" if note(i) else m.role for i, m in enumerate(messages)]
