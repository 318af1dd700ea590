"""The catalog fuzzer: an attacker with write access to catalog.sqlite edits it (never the
block files, never the keyring) and the app must refuse what was edited, by name, or show
exactly what was stored, never something else, and never a traceback.

Each trial copies a pristine data directory (conversations with several turns, a branch, a
document in parts with a conversation on it, a verified answer), applies one random mutation
with plain SQL, then opens it as the app would and reads everything: each conversation's
transcript and graft, each document's parts, the verified answers, and the audit.

Outcomes: *refused* (an operation or the audit named the problem), *unchanged* (everything
read back equals what was stored: the edit touched nothing visible, e.g. a value set to
itself), *silent* (something else was shown without a word: the failure this exists to
find) and *crashed* (an exception that is not a GalahadError: a traceback for a user).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from galahad_desktop.errors import GalahadError
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.vault.keys import MemoryKeyStore
from galahad_dev.fake_engine import fake_factory

Log = Callable[[str], None]
Mutation = Callable[[sqlite3.Connection, random.Random], str]


def _open(data: Path, keystore: MemoryKeyStore) -> Galahad:
    return Galahad(
        data,
        model_path=data.parent / "fake-gemma3.gguf",
        keystore=keystore,
        overrides={"n_ctx": 1024, "temperature": 0.0},
        engine_factory=fake_factory("gemma3"),
    )


def build_store(data: Path, keystore: MemoryKeyStore) -> None:
    core = _open(data, keystore)
    try:
        params = core.sampling(max_tokens=10)
        for words in (("Hello there.", "Tell me more.", "Thanks."), ("One.", "Two.")):
            conversation = core.new_conversation()
            for text in words:
                core.send(conversation, text, params=params)
        core.branch(conversation, 2, "Three instead.", params=params)
        text = "\n\n".join(
            f"Section {i}. " + ("The harbour ledger lists boats and nets. " * 8) for i in range(8)
        )
        deposited = core.deposit_text("ledger.txt", text)
        on_document = core.new_conversation(document_id=deposited.document_id)
        core.send(on_document, "What does the ledger list?", params=params)
        core.verified_add("What is 37 * 12 + 5?", "37 * 12 + 5 = 449.")
    finally:
        core.close()


def visible_state(core: Galahad) -> dict[str, Any]:
    """Everything a user can be shown, read the way the app reads it (grafts included)."""
    state: dict[str, Any] = {"conversations": {}, "documents": {}, "verified": []}
    for summary in core.list_conversations():
        messages = [(m.role, m.text, m.thoughts) for m in core.messages(summary.id)]
        if summary.n_messages:
            report = core.resume(summary.id)
            if report.proof.verdict != "exact":
                raise GalahadError(f"proof {report.proof.verdict}")
        state["conversations"][summary.id] = (summary.title, summary.n_tokens, messages)
    for document in core.list_documents():
        parts = core.parts(document.id)
        texts = [core.documents.part_text(core.documents.part_row(p.id)) for p in parts]
        for result in core.verify(document.id):
            if result.proof != "exact":
                raise GalahadError(f"proof {result.proof}")
        state["documents"][document.id] = (document.name, document.n_tokens, texts)
    state["verified"] = sorted((e.question, e.answer, e.verifier) for e in core.verified_entries())
    return state


# -- mutations ---------------------------------------------------------------------------
def _rows(conn: sqlite3.Connection, sql: str, *args: Any) -> list[sqlite3.Row]:
    return list(conn.execute(sql, args))


def _flip(blob: Any, rng: random.Random) -> bytes:
    data = bytearray(blob)
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def _message(conn: sqlite3.Connection, rng: random.Random) -> sqlite3.Row:
    return rng.choice(_rows(conn, "select * from messages"))


def m_move(conn: sqlite3.Connection, rng: random.Random) -> str:
    m = _message(conn, rng)
    other = rng.choice(
        _rows(conn, "select id from conversations where id != ?", m["conversation_id"])
    )
    (top,) = conn.execute(
        "select coalesce(max(seq), -1) + 1 from messages where conversation_id = ?", (other["id"],)
    ).fetchone()
    conn.execute(
        "update messages set conversation_id = ?, seq = ? where id = ?", (other["id"], top, m["id"])
    )
    return "message moved to another conversation"


def m_reorder(conn: sqlite3.Connection, rng: random.Random) -> str:
    m = _message(conn, rng)
    peers = _rows(
        conn,
        "select * from messages where conversation_id = ? and id != ?",
        m["conversation_id"],
        m["id"],
    )
    o = rng.choice(peers)
    conn.execute("update messages set seq = -1 where id = ?", (m["id"],))
    conn.execute("update messages set seq = ? where id = ?", (m["seq"], o["id"]))
    conn.execute("update messages set seq = ? where id = ?", (o["seq"], m["id"]))
    return "two messages swapped"


def m_role(conn: sqlite3.Connection, rng: random.Random) -> str:
    m = _message(conn, rng)
    role = rng.choice([r for r in ("user", "model", "document") if r != m["role"]])
    conn.execute("update messages set role = ? where id = ?", (role, m["id"]))
    return "message role changed"


def m_range(conn: sqlite3.Connection, rng: random.Random) -> str:
    m = _message(conn, rng)
    column = rng.choice(["tok_start", "tok_end"])
    conn.execute(
        f"update messages set {column} = {column} + ? where id = ?",
        (rng.choice([-3, -1, 1, 5]), m["id"]),
    )
    return "message token range changed"


def m_delete(conn: sqlite3.Connection, rng: random.Random) -> str:
    m = _message(conn, rng)
    conn.execute("delete from messages where id = ?", (m["id"],))
    if rng.random() < 0.5:  # and keep the count consistent
        conn.execute(
            "update conversations set n_messages = n_messages - 1 where id = ?",
            (m["conversation_id"],),
        )
    return "message deleted"


def m_drop_turn(conn: sqlite3.Connection, rng: random.Random) -> str:
    """Drop the last turn and point the head at the previous checkpoint, counts adjusted: the
    most careful rollback an attacker can make without the key."""
    conv = rng.choice(_rows(conn, "select * from conversations where n_messages >= 4"))
    last = _rows(
        conn,
        "select * from messages where conversation_id = ? order by seq desc limit 2",
        conv["id"],
    )
    conn.execute("delete from messages where id in (?, ?)", (last[0]["id"], last[1]["id"]))
    previous = _rows(
        conn,
        "select * from blocks where owner_id = ? and id != ? order by pos_end desc",
        conv["id"],
        conv["head_block_id"],
    )
    head = previous[0] if previous else None
    conn.execute(
        "update conversations set n_messages = ?, head_block_id = ?, n_tokens = ? where id = ?",
        (
            conv["n_messages"] - 2,
            head["id"] if head else None,
            head["pos_end"] if head else 0,
            conv["id"],
        ),
    )
    if head is not None:
        conn.execute(
            "update messages set block_id = ? where id = (select id from messages"
            " where conversation_id = ? order by seq desc limit 1)",
            (head["id"], conv["id"]),
        )
    return "last turn rolled back"


def m_text(conn: sqlite3.Connection, rng: random.Random) -> str:
    m = _message(conn, rng)
    choice = rng.randrange(4)
    if choice == 0:
        other = rng.choice(_rows(conn, "select text_enc from messages where id != ?", m["id"]))
        value: Any = other["text_enc"]
    elif choice == 1:
        value = _flip(m["text_enc"], rng)
    elif choice == 2:
        value = rng.choice(["plain text", 7, None, b""])
    else:
        value = m["text_enc"][: rng.randrange(len(m["text_enc"]))]
    conn.execute("update messages set text_enc = ? where id = ?", (value, m["id"]))
    return "message text replaced"


def m_block(conn: sqlite3.Connection, rng: random.Random) -> str:
    m = _message(conn, rng)
    choices = [b["id"] for b in _rows(conn, "select id from blocks")] + [None]
    value = rng.choice([c for c in choices if c != m["block_id"]])
    conn.execute("update messages set block_id = ? where id = ?", (value, m["id"]))
    return "message checkpoint changed"


def m_duplicate(conn: sqlite3.Connection, rng: random.Random) -> str:
    m = dict(_message(conn, rng))
    (top,) = conn.execute(
        "select max(seq) + 1 from messages where conversation_id = ?", (m["conversation_id"],)
    ).fetchone()
    m.update(id=m["id"][:-4] + "beef", seq=top)
    conn.execute(
        f"insert into messages ({', '.join(m)}) values ({', '.join('?' * len(m))})",
        tuple(m.values()),
    )
    conn.execute(
        "update conversations set n_messages = n_messages + 1 where id = ?", (m["conversation_id"],)
    )
    return "message duplicated"


def c_head(conn: sqlite3.Connection, rng: random.Random) -> str:
    conv = rng.choice(_rows(conn, "select * from conversations where head_block_id is not null"))
    block = rng.choice(_rows(conn, "select * from blocks where id != ?", conv["head_block_id"]))
    conn.execute(
        "update conversations set head_block_id = ?, n_tokens = ? where id = ?",
        (block["id"], block["pos_end"], conv["id"]),
    )
    return "conversation head moved"


def c_field(conn: sqlite3.Connection, rng: random.Random) -> str:
    conv = rng.choice(_rows(conn, "select * from conversations"))
    column, value = rng.choice(
        [
            ("n_messages", (conv["n_messages"] or 0) + rng.choice([-2, -1, 1])),
            ("n_tokens", (conv["n_tokens"] or 0) + rng.choice([-7, 1])),
            ("thinking", 1 - (conv["thinking"] or 0)),
            ("system_prompt", "coder" if conv["system_prompt"] != "coder" else "none"),
            (
                "document_id",
                None if conv["document_id"] else _rows(conn, "select id from documents")[0]["id"],
            ),
        ]
    )
    conn.execute(f"update conversations set {column} = ? where id = ?", (value, conv["id"]))
    return f"conversation {column} changed"


def c_blob(conn: sqlite3.Connection, rng: random.Random) -> str:
    conv = rng.choice(_rows(conn, "select * from conversations"))
    other = rng.choice(_rows(conn, "select * from conversations where id != ?", conv["id"]))
    column = rng.choice(["title_enc", "seal"])
    value = rng.choice([other[column], _flip(conv[column], rng), None])
    conn.execute(f"update conversations set {column} = ? where id = ?", (value, conv["id"]))
    return f"conversation {column} replaced"


def d_parts(conn: sqlite3.Connection, rng: random.Random) -> str:
    parts = _rows(conn, "select * from parts")
    a, b = rng.sample(parts, 2)
    choice = rng.randrange(5)
    if choice == 0:
        conn.execute("update parts set block_id = ? where id = ?", (b["block_id"], a["id"]))
        conn.execute("update parts set block_id = ? where id = ?", (a["block_id"], b["id"]))
        return "two parts' blocks swapped"
    if choice == 1:
        conn.execute("update parts set part_no = ? where id = ?", (b["part_no"], a["id"]))
        conn.execute("update parts set part_no = ? where id = ?", (a["part_no"], b["id"]))
        return "two parts renumbered"
    if choice == 2:
        conn.execute("update parts set text_enc = ? where id = ?", (b["text_enc"], a["id"]))
        return "part text replaced"
    if choice == 3:
        conn.execute("delete from parts where id = ?", (a["id"],))
        return "part deleted"
    conn.execute("update parts set n_tokens = n_tokens + 1 where id = ?", (a["id"],))
    return "part token count changed"


def d_document(conn: sqlite3.Connection, rng: random.Random) -> str:
    doc = _rows(conn, "select * from documents")[0]
    choice = rng.randrange(4)
    if choice == 0:
        part = rng.choice(_rows(conn, "select * from parts where block_id != ?", doc["block_id"]))
        conn.execute(
            "update documents set block_id = ? where id = ?", (part["block_id"], doc["id"])
        )
        return "document block moved"
    if choice == 1:
        conn.execute(
            "update documents set name_enc = ? where id = ?",
            (_flip(doc["name_enc"], rng), doc["id"]),
        )
        return "document name damaged"
    if choice == 2:
        conn.execute("update documents set n_parts = n_parts - 1 where id = ?", (doc["id"],))
        return "document part count changed"
    conn.execute("update documents set text_enc = ? where id = ?", (doc["name_enc"], doc["id"]))
    return "document text replaced"


def v_entry(conn: sqlite3.Connection, rng: random.Random) -> str:
    entry = _rows(conn, "select * from verified")[0]
    choice = rng.randrange(4)
    if choice == 0:
        conn.execute("update verified set answer_enc = question_enc where id = ?", (entry["id"],))
        return "verified answer replaced"
    if choice == 1:
        block = rng.choice(_rows(conn, "select id from blocks where id != ?", entry["block_id"]))
        conn.execute("update verified set block_id = ? where id = ?", (block["id"], entry["id"]))
        return "verified block moved"
    if choice == 2:
        conn.execute("update verified set verifier = 'user' where id = ?", (entry["id"],))
        return "verified verifier changed"
    conn.execute("update verified set lookup = ? where id = ?", ("0" * 64, entry["id"]))
    return "verified lookup changed"


def b_block(conn: sqlite3.Connection, rng: random.Random) -> str:
    block = rng.choice(_rows(conn, "select * from blocks"))
    other = rng.choice(
        _rows(
            conn,
            "select * from blocks where id != ? and owner_id != ?",
            block["id"],
            block["owner_id"],
        )
    )
    parents = [b["id"] for b in _rows(conn, "select id from blocks")] + [None]
    column, value = rng.choice(
        [
            (
                "file_name",
                rng.choice(["../catalog.sqlite", "/etc/passwd", other["file_name"], "b-zz.gkv"]),
            ),
            ("owner_id", other["owner_id"]),
            ("parent_id", rng.choice([p for p in parents if p != block["parent_id"]])),
            ("pos_start", block["pos_start"] + 1),
            ("tokens_enc", other["tokens_enc"]),
            ("wrapped_key", other["wrapped_key"]),
            ("kind", "verified" if block["kind"] != "verified" else "document"),
            ("fingerprint", other["fingerprint"] + "x"),
            ("header_sha256", other["header_sha256"]),
        ]
    )
    conn.execute(f"update blocks set {column} = ? where id = ?", (value, block["id"]))
    return f"block {column} changed"


def meta(conn: sqlite3.Connection, rng: random.Random) -> str:
    key, value = rng.choice(
        [
            ("schema_version", b"99"),
            ("schema_version", b"x"),
            ("schema_version", b"1"),
            ("schema_version", None),
            ("vault_id", b"0000000000000000"),
            ("active_key_id", b"deadbeef"),
            ("catalog_key_wrapped", None),
            ("generation", None),  # an older copy's counter: absent
            ("generation", b"\x01" * 45),
            ("retired_key_ids", b"{not json"),
        ]
    )
    if value is None:
        conn.execute("delete from meta where key = ?", (key,))
    else:
        conn.execute("insert or replace into meta (key, value) values (?, ?)", (key, value))
    return f"meta {key} changed"


def any_cell(conn: sqlite3.Connection, rng: random.Random) -> str:
    """Any column of any row of any table: a flipped bit, NULL, another type, or the value
    of the same column in another row."""
    tables = [t for (t,) in conn.execute("select name from sqlite_master where type='table'")]
    while True:
        table = rng.choice(tables)
        rows = _rows(conn, f"select rowid as _rowid, * from {table}")
        if rows:
            break
    row = rng.choice(rows)
    column = rng.choice([c for c in row.keys() if c != "_rowid"])  # noqa: SIM118 - a Row
    value = row[column]
    choice = rng.randrange(4)
    if choice == 0 and isinstance(value, bytes) and value:
        new: Any = _flip(value, rng)
    elif choice == 0 and isinstance(value, int | float):
        new = value + rng.choice([-1, 1])
    elif choice == 1:
        new = None
    elif choice == 2:
        new = rng.choice(["text", 3, 2.5, b"\x00\xff"])
    else:
        new = rng.choice(rows)[column]
    if new == value:  # a no-op is no test
        new = None if value is not None else "text"
    try:
        conn.execute(f"update {table} set {column} = ? where rowid = ?", (new, row["_rowid"]))
    except sqlite3.IntegrityError:  # a unique or primary key clash: SQLite itself refuses it
        conn.execute(f"update {table} set {column} = NULL where rowid = ?", (row["_rowid"],))
    return f"{table}.{column} edited"


def any_row(conn: sqlite3.Connection, rng: random.Random) -> str:
    """A whole row deleted or duplicated (under a new id), or a whole table dropped."""
    tables = [t for (t,) in conn.execute("select name from sqlite_master where type='table'")]
    table = rng.choice(tables)
    rows = _rows(conn, f"select * from {table}")
    choice = rng.randrange(3)
    if choice == 0 or not rows:
        conn.execute(f"drop table {table}")
        return f"table {table} dropped"
    row = dict(rng.choice(rows))
    if choice == 1:
        key = "key" if table == "meta" else "id"
        conn.execute(f"delete from {table} where {key} = ?", (row[key],))
        return f"a row of {table} deleted"
    if table == "meta":
        row["key"] = row["key"] + "-copy"
    else:
        row["id"] = str(row["id"])[:-4] + "f00d"
    if "seq" in row:
        row["seq"] = int(row["seq"]) + 1000
    columns = ", ".join(row)
    conn.execute(
        f"insert into {table} ({columns}) values ({', '.join('?' * len(row))})", tuple(row.values())
    )
    return f"a row of {table} duplicated"


MUTATIONS: dict[str, Mutation] = {
    "message moved": m_move,
    "messages reordered": m_reorder,
    "message role": m_role,
    "message range": m_range,
    "message deleted": m_delete,
    "turn rolled back": m_drop_turn,
    "message text": m_text,
    "message checkpoint": m_block,
    "message duplicated": m_duplicate,
    "conversation head": c_head,
    "conversation field": c_field,
    "conversation blob": c_blob,
    "document parts": d_parts,
    "document": d_document,
    "verified entry": v_entry,
    "block row": b_block,
    "meta": meta,
    "any cell": any_cell,
    "any row or table": any_row,
}


def catalog_fuzz(mutations: int, seed: int, log: Log) -> dict[str, Any]:
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="galahad-catalog-fuzz-"))
    keystore = MemoryKeyStore()
    pristine = root / "pristine" / "data"
    pristine.parent.mkdir()
    by_kind: Counter[str] = Counter()
    outcome: Counter[str] = Counter()
    examples: dict[str, str] = {}
    try:
        build_store(pristine, keystore)
        core = _open(pristine, keystore)
        try:
            expected = visible_state(core)
            assert core.audit().problems == []
        finally:
            core.close()
        catalog_bytes = (pristine / "catalog.sqlite").read_bytes()
        keys = dict(keystore.entries)  # each trial starts from the same keystore
        # Every kind in turn; "any cell" (every column of every table) three times as often.
        kinds = [*MUTATIONS, "any cell", "any cell", "any row or table"]
        for index in range(mutations):
            kind = kinds[index % len(kinds)]
            trial = root / "trial" / "data"
            shutil.rmtree(trial.parent, ignore_errors=True)
            shutil.copytree(pristine.parent, trial.parent)
            conn = sqlite3.connect(trial / "catalog.sqlite", isolation_level=None)
            conn.row_factory = sqlite3.Row
            try:
                conn.execute("begin")
                what = MUTATIONS[kind](conn, rng)
                conn.execute("commit")
            finally:
                conn.close()
            by_kind[kind] += 1
            keystore.entries = dict(keys)
            result, detail = _probe(trial, keystore, expected)
            outcome[result] += 1
            if result != "refused" or kind not in examples:
                examples.setdefault(f"{result}: {what}" if result != "refused" else kind, detail)
            if index % 200 == 199:
                log(f"catalog fuzz: {index + 1}/{mutations}")
        intact = (pristine / "catalog.sqlite").read_bytes() == catalog_bytes
        return {
            "command": "eval catalog",
            "mutations": mutations,
            "seed": seed,
            "refused": outcome["refused"],
            "unchanged": outcome["unchanged"],
            "silent": outcome["silent"],
            "crashed": outcome["crashed"],
            "by_kind": dict(by_kind),
            "examples": examples,
            "pristine_intact": intact,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _probe(data: Path, keystore: MemoryKeyStore, expected: dict[str, Any]) -> tuple[str, str]:
    core: Galahad | None = None
    try:
        core = _open(data, keystore)
        problems = core.audit().problems
        seen = visible_state(core)
    except GalahadError as exc:
        return "refused", str(exc)
    except Exception as exc:  # the fuzzer's purpose: find these
        return "crashed", f"{type(exc).__name__}: {exc}"
    finally:
        if core is not None:
            with contextlib.suppress(Exception):
                core.close()
    if problems:
        return "refused", problems[0]
    if seen == expected:
        return "unchanged", "everything read back as stored"
    return "silent", "shown without a word: " + _difference(expected, seen)


def _difference(expected: dict[str, Any], seen: dict[str, Any]) -> str:
    for section in expected:
        if expected[section] != seen[section]:
            return f"{section} differ"
    return "?"
