"""The disk budget (fast tier, the fake engine; real vault, catalog, chains and proofs):
sizes people write, what `storage` reports against the bytes on disk, what is given back
first, what never is, re-reading what was given back, and a give-back cut short."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from galahad_desktop.errors import InputError, WontFitError
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.settings import coerce
from galahad_desktop.sizes import human_size, parse_size
from galahad_desktop.vault import giveback

CoreFactory = Callable[..., Galahad]
WORDS = "the ledger keeps every token the model read " * 10


def _files_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _chat(core: Galahad, turns: int, tag: str) -> str:
    conversation = core.new_conversation()
    for turn in range(turns):
        text = f"{tag} turn {turn}: {WORDS}"
        core.send(conversation, text, params=core.sampling(max_tokens=6))
    return conversation


def test_sizes_are_read_as_people_write_them() -> None:
    assert parse_size("20GB") == 20_000_000_000
    assert parse_size("1.5 TB") == 1_500_000_000_000
    assert parse_size("800MiB") == 800 * 1024**2
    assert parse_size("0") == 0
    assert parse_size("4096") == 4096
    for bad in ("twenty", "20 GX", "-5GB", "1e9", "9" * 50):
        with pytest.raises(InputError, match="must be a size such as 20GB"):
            parse_size(bad)
    assert coerce("disk_budget", "20GB") == 20_000_000_000
    assert coerce("disk_budget", "auto") is None
    assert coerce("disk_budget", 0) == 0
    with pytest.raises(InputError, match="disk_budget"):
        coerce("disk_budget", "lots")
    assert human_size(1_234_567_890) == "1.2 GB"
    assert parse_size(human_size(20_000_000_000).replace(" ", "")) == 20_000_000_000


def test_a_budget_past_the_whole_disk_is_not_saved(tmp_path: Path) -> None:
    """Issue #60 item 15: a disk budget no disk could reach was saved as given."""
    import shutil

    from galahad_desktop.settings import Settings

    settings = Settings(tmp_path)
    settings.update({"disk_budget": "20GB"})
    saved = (tmp_path / Settings.FILE_NAME).read_bytes()
    disk = shutil.disk_usage(tmp_path).total
    for past in (disk + 1, "9000TB", 2**62):
        with pytest.raises(InputError, match="more than the whole disk") as refused:
            settings.update({"disk_budget": past})
        assert "Nothing was saved" in str(refused.value)
    with pytest.raises(InputError, match="at most"):  # past the setting's own maximum
        settings.update({"disk_budget": 2**62 + 1})
    assert (tmp_path / Settings.FILE_NAME).read_bytes() == saved
    assert Settings(tmp_path).values.disk_budget == 20_000_000_000
    settings.update({"disk_budget": disk})  # the whole disk is a budget that can hold
    assert Settings(tmp_path).values.disk_budget == disk


def test_storage_reports_what_is_on_disk(make_fake_core: CoreFactory, tmp_path: Path) -> None:
    core = make_fake_core(disk_budget=0, n_ctx=8192)
    first = _chat(core, 3, "first")
    second = _chat(core, 2, "second")
    report = core.storage()
    assert report.budget_bytes == 0 and "no limit" in report.budget_rule
    # The total is the data directory as the disk holds it, counted independently here.
    assert abs(report.total_bytes - _files_bytes(tmp_path / "data")) <= 0.05 * report.total_bytes
    assert report.blocks_bytes == _files_bytes(tmp_path / "data" / "blocks")
    items = {i.id: i for i in report.items}
    assert set(items) == {first, second}
    assert items[first].bytes > 0 and items[first].state == "stored"
    assert sum(i.bytes for i in report.items) == report.blocks_bytes
    assert items[second].open and not items[first].open  # the model holds the newest
    assert report.items[0].id == second  # most recently used first


def test_the_budget_gives_back_what_was_used_longest_ago(make_fake_core: CoreFactory) -> None:
    core = make_fake_core(disk_budget=0, n_ctx=8192)
    chats = [_chat(core, 3, f"chat {n}") for n in range(4)]
    core.resume(chats[0])  # used again: now the second oldest use is chats[1]
    core.resume(chats[3])
    core.keep(chats[1])  # pinned: never given back
    sizes = {i.id: i.bytes for i in core.storage().items}
    total = core.storage().total_bytes
    budget = total - sizes[chats[2]] // 2  # one more turn must free at least one chat
    core.update_settings({"disk_budget": budget})
    core.send(chats[3], f"one more {WORDS}", params=core.sampling(max_tokens=6))
    report = core.storage()
    items = {i.id: i for i in report.items}
    largest_block = max(r["file_bytes"] for r in core.vault.records.blocks())
    assert report.total_bytes <= budget + largest_block
    assert items[chats[2]].state == "needs re-reading" and items[chats[2]].bytes == 0
    assert items[chats[1]].state == "stored" and items[chats[1]].kept
    assert items[chats[3]].state == "stored"  # the open conversation
    assert next(g.item_id for g in core.given_back_since()) == chats[2]
    assert core.conversation(chats[2]).memory == "needs re-reading"
    assert core.audit().problems == []
    # Re-read once (from the ledger that stayed), stored again, then grafted exactly.
    messages = [(m.role, m.text) for m in core.messages(chats[2])]
    core.update_settings({"disk_budget": 0})
    reread = core.resume(chats[2])
    assert reread.recomputed_tokens > 0 and "disk budget" in (reread.fallback_reason or "")
    assert [(m.role, m.text) for m in core.messages(chats[2])] == messages
    core.reload_engine()
    again = core.resume(chats[2])
    assert again.recomputed_tokens == 0 and again.proof.verdict == "exact"
    assert core.storage().items[0].id == chats[2]
    assert core.audit().problems == []


def test_a_document_that_would_not_fit_is_refused_before_it_is_read(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core(disk_budget=0, n_ctx=8192)
    first = core.deposit_text("first.txt", WORDS * 2)
    estimate = core.storage_room.estimate(first.tokens)  # measured from that stored block
    assert estimate is not None and abs(estimate - first.block_bytes) < 0.1 * first.block_bytes
    chat = _chat(core, 2, "kept")
    core.keep(chat)  # pinned: its memory is not room for the document
    blocks = sorted(core.vault.records.blocks(), key=str)
    before = (core.storage(), len(core.list_documents()), blocks)
    # Room for what is stored, half of the first document again, not for three times it.
    core.update_settings({"disk_budget": before[0].total_bytes + first.block_bytes // 2})
    with pytest.raises(WontFitError) as refused:
        core.deposit_text("big.txt", WORDS * 6)
    said = str(refused.value)
    assert "'big.txt'" in said and "Disk space for memory" in said and "anyway" in said
    assert "Nothing was read" in said and refused.value.exit_code == 11
    assert len(core.list_documents()) == before[1]  # nothing read, nothing stored or given back
    assert sorted(core.vault.records.blocks(), key=str) == before[2]
    # The person reads it anyway: stored, past the budget (what was pinned stays).
    read = core.deposit_text("big.txt", WORDS * 6, anyway=True)
    assert read.tokens > 2 * first.tokens and len(core.list_documents()) == before[1] + 1
    assert {i.id: i.state for i in core.storage().items}[chat] == "stored"
    assert core.audit().problems == []


def test_a_document_given_back_is_read_again_for_its_questions(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core(disk_budget=0, n_ctx=8192)
    doc = core.deposit_text("notes.txt", "Lyon is where the depot stands. " * 20)
    conversation = core.new_conversation(document_id=doc.document_id)
    core.send(conversation, "Where is the depot?", params=core.sampling(max_tokens=4))
    done = core.give_back(doc.document_id)
    assert done.blocks >= 1 and done.bytes_freed > 0
    assert core.list_documents()[0].status == "needs re-reading"
    assert core.conversation(conversation).memory == "needs re-reading"  # its root went
    states = {i.id: i.state for i in core.storage().items}
    assert states == {doc.document_id: "needs re-reading", conversation: "needs re-reading"}
    core.reload_engine()
    report = core.resume(conversation)
    assert report.recomputed_tokens > 0
    assert core.conversation(conversation).memory == "stored"
    assert core.audit().problems == []


def test_a_give_back_cut_short_loses_nothing(make_fake_core: CoreFactory) -> None:
    core = make_fake_core(disk_budget=0, n_ctx=8192)
    conversation = _chat(core, 2, "cut short")
    ids = [r["id"] for r in core.vault.records.blocks(owner_id=conversation)]
    # The catalog says given back, the files are still there (killed between the two).
    with core.vault.transaction():
        core.vault.catalog.update_in("blocks", {"evicted_at": 1.0}, "id", ids)
    report = core.audit()
    assert report.problems == [] and report.given_back == len(ids)
    assert core.audit(repair=True).repaired  # the leftover files removed
    assert giveback.finish(core.vault) == 0
    core.reload_engine()
    assert core.resume(conversation).recomputed_tokens > 0


def test_the_open_conversation_is_never_given_back(make_fake_core: CoreFactory) -> None:
    core = make_fake_core(disk_budget=1, n_ctx=8192)  # all but the open one goes
    older = _chat(core, 2, "older")
    newer = _chat(core, 2, "newer")
    items = {i.id: i for i in core.storage().items}
    assert items[older].state == "needs re-reading"
    assert items[newer].state == "stored" and items[newer].bytes > 0
    assert core.storage().over_budget


def _disk(monkeypatch: pytest.MonkeyPatch, total: int, free: int) -> None:
    import shutil as real_shutil
    from collections import namedtuple

    from galahad_desktop.memory import storage

    usage = namedtuple("usage", "total used free")

    class Disk:
        def __getattr__(self, name: str) -> object:
            return getattr(real_shutil, name)

        @staticmethod
        def disk_usage(_path: object) -> object:
            return usage(total, total - free, free)

    monkeypatch.setattr(storage, "shutil", Disk())


@pytest.mark.parametrize(
    ("total", "free", "budget", "says"),
    [
        (500 * 10**9, 200 * 10**9, 100 * 10**9, "a quarter of the 500.0 GB disk"),
        (3 * 10**9, 2_500_000_000, 1 * 10**9, "the minimum (1.0 GB), more than a quarter"),
        (52_400_000, 50_000_000, 25_000_000, "half of its free space (25.0 MB)"),
    ],
)
def test_the_automatic_budget_says_which_rule_set_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, total: int, free: int, budget: int, says: str
) -> None:
    from galahad_desktop.memory.storage import budget_for

    _disk(monkeypatch, total, free)
    used, chosen, rule = budget_for(tmp_path, None)
    assert used == 0 and chosen == budget and says in rule
    assert chosen <= max(free // 2, 0) or chosen <= total // 4  # never more than the disk gives


def test_the_automatic_budget_does_not_move_with_every_file_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue #59 item 3: bound by half the free space, it moved 40.5 -> 38.4 -> 41.2 GB
    within an hour of use."""
    from galahad_desktop.memory.storage import budget_for

    budgets = []
    for free in (81_000_000_000, 80_300_000_000, 79_100_000_000, 82_400_000_000):
        _disk(monkeypatch, 240 * 10**9, free)  # a quarter: 60 GB; steps of 3 GB
        _used, chosen, rule = budget_for(tmp_path, None)
        budgets.append(chosen)
        assert chosen <= free // 2 and "in steps of 3.0 GB" in rule
    assert budgets == [39 * 10**9, 39 * 10**9, 39 * 10**9, 39 * 10**9]
    _disk(monkeypatch, 240 * 10**9, 70 * 10**9)  # the disk really filled: it follows
    assert budget_for(tmp_path, None)[1] == 33 * 10**9


def test_on_a_small_full_disk_the_refusal_asks_for_disk_space_not_a_budget(
    make_fake_core: CoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_fake_core(n_ctx=8192)
    first = core.deposit_text("first.txt", WORDS * 2)
    _disk(monkeypatch, 52_400_000, first.block_bytes)  # room left for one more, barely
    with pytest.raises(WontFitError) as refused:
        core.deposit_text("second.txt", WORDS * 2)
    said = str(refused.value)
    assert "the disk's free space" in said and "kept free" in said
    assert "Free space on this disk" in said and "Raise 'Disk space" not in said
    assert len(core.list_documents()) == 1
    _disk(monkeypatch, 52_400_000, 40_000_000)  # 5.2 MB kept free, not 256 MB
    assert core.deposit_text("second.txt", WORDS * 2).tokens > 0  # 256 MB kept free refused it


def test_a_kept_item_is_not_given_back_by_hand(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()
    chat = _chat(core, 2, "kept")
    core.keep(chat)
    blocks = sorted(core.vault.records.blocks(), key=str)
    with pytest.raises(InputError, match="is kept: its memory is never given back"):
        core.give_back(chat)
    assert sorted(core.vault.records.blocks(), key=str) == blocks
    assert {i.id: i.state for i in core.storage().items}[chat] == "stored"
