"""Maintenance: prove, audit, forget, keys — and re-reading what another model made."""

from __future__ import annotations

from typing import Any

from galahad_desktop.engine.picture import Media, Picture, Sound, holds_pictures
from galahad_desktop.errors import InputError, NotFoundError
from galahad_desktop.memory.chat.conversations import Conversations
from galahad_desktop.memory.chat.live import GIVEN_BACK, LiveContext, Rendered, engine_answer
from galahad_desktop.memory.chat.tool_turns import (
    call_tokens,
    declared,
    result_tokens,
    results_from_json,
)
from galahad_desktop.memory.documents.documents import Documents
from galahad_desktop.memory.results import ForgetResult, KeyStatus, RotateResult, VerifyResult
from galahad_desktop.memory.retrieval.routing import Routing
from galahad_desktop.memory.verified.library import VerifiedLibrary
from galahad_desktop.vault import custody
from galahad_desktop.vault.names import BlockRow, ConversationRow, Table, given_back
from galahad_desktop.vault.vault import AuditReport


class Maintenance:
    def __init__(
        self,
        live: LiveContext,
        conversations: Conversations,
        documents: Documents,
        routing: Routing,
        library: VerifiedLibrary,
    ) -> None:
        self.live = live
        self.vault = live.vault
        self.conversations = conversations
        self.documents = documents
        self.routing = routing
        self.library = library

    @property
    def engine(self) -> Any:
        return self.live.engine

    def ledger_for_model(self, row: BlockRow) -> Rendered | None:
        """A block made under another model file is re-read from its text, rebuilt with this
        model's tokenizer and turn format (the old token ids mean nothing to it). A block
        from the same model under other runtime settings re-reads its token ledger, unless
        it holds pictures: the projector or its budget may give a picture another number of
        positions, so its ledger is rebuilt too."""
        made_with = row.get("model_sha256")
        same_model = not made_with or made_with == self.live.engine.model_sha256
        if same_model and not holds_pictures(self.vault.chain_tokens(row["id"])):
            return None
        if row["kind"] == "conversation":
            return self.rendered_conversation(row)
        if row["kind"] == "document":
            rendered = self.documents.rendered_part(row["id"])
            if rendered is None:
                return None
            tokens, pictures = rendered

            def recount(new_row: BlockRow) -> list[str]:
                self.documents.recount_part(new_row["id"], len(tokens))
                return []

            return Rendered(tokens, recount, pictures)
        if row["kind"] == "verified":
            return self.library.rendered(row)
        return None

    def pictures_for(self, row: BlockRow) -> list[Media]:
        """The pictures a block's ledger holds, in ledger order (to read it again)."""
        if row["kind"] == "document":
            return self.documents.part_pictures(row["id"])
        if row["kind"] != "conversation":
            return []
        conv = self.conversations.row(row["owner_id"])
        pictures: list[Media] = []
        if conv["document_id"]:
            pictures += self.documents.part_pictures(
                self.documents.row(conv["document_id"])["block_id"]
            )
        return pictures + self.conversations.message_pictures(conv["id"], row["pos_end"])

    def rendered_conversation(self, row: BlockRow) -> Rendered:
        conversations = self.conversations
        conv = conversations.row(row["owner_id"])
        if conv["head_block_id"] != row["id"]:
            raise InputError(
                "This conversation was made with another model; open it first so it is "
                "re-read once under this one, then go back to an earlier turn."
            )
        document_tokens = None
        pictures: list[Media] = []
        if conv["document_id"]:
            doc = self.documents.row(conv["document_id"])
            rendered = self.documents.rendered_part(doc["block_id"])
            if rendered is not None and rendered[1]:
                document_tokens, pictures = rendered
            else:
                document_tokens = self.documents.document_tokens(
                    self.documents.name(doc), self.documents.text(doc["id"])
                )
        tokens, ranges, pictures = self.conversation_ledger(conv, document_tokens, pictures)
        records = self.vault.records

        def apply(new_row: BlockRow) -> list[str]:
            messages = conversations.message_rows(conv["id"])
            for message, (start, end) in zip(messages, ranges, strict=False):
                last = message is messages[-1]
                self.live.records.move_message(
                    message,
                    {
                        "tok_start": start,
                        "tok_end": end,
                        "block_id": new_row["id"] if last else None,
                    },
                )
            records.update(
                "conversations",
                conv["id"],
                {"n_tokens": new_row["pos_end"], "model_sha256": self.live.engine.model_sha256},
            )
            # The other model's checkpoints mean nothing to this one.
            return [
                b["id"]
                for b in records.blocks(owner_id=conv["id"])
                if b["id"] not in (row["id"], new_row["id"])
            ]

        return Rendered(tokens, apply, pictures)

    def conversation_ledger(
        self,
        conv: ConversationRow,
        document_tokens: list[int] | None,
        pictures: list[Media] | None = None,
    ) -> tuple[list[int], list[tuple[int, int]], list[Media]]:
        """The conversation's ledger rebuilt from its messages for the current model (its
        tokenizer and turn format), and each message's token range: what a conversation
        made under another model is re-read as. `document_tokens`: the document turn a
        conversation on a document starts with."""
        turns = self.live.engine.turns
        pictures = list(pictures or [])
        system = self.conversations.system_text(conv)
        thinking = bool(conv.get("thinking")) and turns.supports_thinking
        tools = self.conversations.system_tools(conv)
        if document_tokens is not None:
            tokens = list(document_tokens) + turns.probe
        else:
            tokens = turns.start(
                system, thinking, declared(self.live.engine, tools) if tools else ()
            )
        probe = len(turns.probe)  # held past the last message (0: its model turn goes on)
        ranges: list[tuple[int, int]] = []
        messages = self.conversations.messages(conv["id"])
        rows = self.conversations.message_rows(conv["id"])
        for index in range(0, len(messages) - 1, 2):
            user, reply = messages[index], messages[index + 1]
            user_start = len(tokens) - probe
            if user.role == "document" and user.sound is not None:
                parts = Sound.from_wav(user.sound).parts()
                tokens += self.documents.memo_ledger(user.text, parts, len(pictures), opening=False)
                pictures += parts
                ranges += [(user_start, len(tokens)), (len(tokens), len(tokens))]
                tokens += turns.probe
                continue
            if user.role == "document" and user.picture is not None:
                picture = Picture.from_png(user.picture)
                tokens += self.documents.picture_ledger(
                    user.text, 1, 1, picture, len(pictures), opening=False
                )
                pictures.append(picture)
                ranges += [(user_start, len(tokens)), (len(tokens), len(tokens))]
                tokens += turns.probe
                continue
            if user.role == "document":
                body = self.conversations.document_content(rows[index])
                tokens += turns.document_turn(
                    f'Document "{user.text}":\n\n{body}', reply.text, opening=False
                )
                ranges += [(user_start, len(tokens)), (len(tokens), len(tokens))]
                tokens += turns.probe
                continue
            first = index == 0 and document_tokens is None
            engine = self.live.engine
            if user.role == "tool":  # results given back inside the model turn that called
                tokens += result_tokens(engine, results_from_json(user.text))
            else:
                tokens += turns.user_turn(turns.user_text(user.text, system, first), thinking)
            reply_start = len(tokens)
            tokens += engine_answer(engine, reply.text)
            tokens += call_tokens(engine, reply.calls) if reply.calls else turns.model_close
            ranges += [(user_start, reply_start), (reply_start, len(tokens))]
            probe = 0 if reply.calls else len(turns.probe)
            tokens += turns.probe[:probe]
        return tokens[: len(tokens) - probe], ranges, pictures

    def kind_of(self, item_id: str) -> str:
        records = self.vault.records
        tables: tuple[tuple[Table, str], ...] = (
            ("conversations", "conversation"),
            ("documents", "document"),
            ("blocks", "block"),
        )
        for table, kind in tables:
            if records.get(table, item_id) is not None:
                return kind
        raise NotFoundError(f"Nothing stored has the id '{item_id}'.")

    def verify_block(self, block_id: str) -> VerifyResult:
        """Re-run the graft proof of one block in this engine; report, change nothing."""
        row = self.vault.block_row(block_id)
        # A block holding pictures is stored under its projector's fingerprint: checked
        # against that, not the engine's alone.
        matches = self.live.current(row)
        chain = self.vault.chain_rows(block_id)
        base: dict[str, Any] = {
            "block_id": block_id,
            "owner_id": row["owner_id"],
            "kind": row["kind"],
            "tokens": row["pos_end"],
            "links": len(chain),
            "fingerprint": row["fingerprint"],
            "fingerprint_matches": matches,
        }
        if any(given_back(link) for link in chain):
            return VerifyResult(**base, proof="skipped", reason=GIVEN_BACK)
        if not matches:
            return VerifyResult(
                **base, proof="skipped", reason="captured under another model or runtime"
            )
        self.live.drop()
        restore_ms, _n, result = self.live.restore_and_prove(
            block_id, self.conversations.chain_owners(row["owner_id"])
        )
        self.live.mark(row["owner_id"], block_id)
        return VerifyResult(
            **base,
            proof=result.verdict,
            restore_ms=restore_ms,
            proof_ms=result.proof_ms,
            max_abs_delta=result.max_abs_delta,
            kl=result.kl,
            argmax_agree=result.argmax_agree,
        )

    def verify(self, item_id: str | None = None) -> list[VerifyResult]:
        if item_id is None:  # every block that has a file (a given-back one has none)
            block_ids = [
                r["id"] for r in self.vault.records.blocks("created_at") if not given_back(r)
            ]
        else:
            kind = self.kind_of(item_id)
            if kind == "conversation":
                block_ids = [self.conversations.head_block(item_id)]
            elif kind == "document":
                block_ids = [r["block_id"] for r in self.documents.part_rows(item_id)] or [
                    self.documents.row(item_id)["block_id"]
                ]
            else:
                block_ids = [item_id]
        return [self.verify_block(b) for b in block_ids]

    def forget(self, item_id: str) -> ForgetResult:
        """Delete a conversation or a document with its blocks and their keys.

        Forgetting a document also forgets the conversations built on it (their blocks hold
        the document's content too), its routing-log lines and its usage lines.
        """
        kind = self.kind_of(item_id)
        if kind == "block":
            raise InputError("Forget a conversation or a document, not a single block.")
        records = self.vault.records
        conversations = (
            [item_id]
            if kind == "conversation"
            else [r["id"] for r in records.conversations(document_id=item_id)]
        )
        owners = [*conversations, *([item_id] if kind == "document" else [])]
        block_ids = [r["id"] for r in records.select_in("blocks", "owner_id", owners)]
        log_lines = self.routing.forget_log_of(item_id) if kind == "document" else []
        with self.vault.transaction():
            records.delete_in("messages", "conversation_id", conversations)
            records.delete_in("reply_versions", "conversation_id", conversations)
            records.delete_in("api_prefixes", "conversation_id", conversations)
            records.delete_in("conversations", "id", conversations)
            if kind == "document":
                records.delete("documents", id=item_id)
                records.delete_in(
                    "part_vectors",
                    "part_id",
                    [r["id"] for r in records.parts(document_id=item_id)],
                )
                records.delete("parts", document_id=item_id)
            records.delete_in("routing_log", "id", log_lines)
            records.delete_in("usage", "owner_id", owners)
            self.vault.delete_block_rows(block_ids)
            # A shared system prompt no remaining conversation starts with goes too.
            shared = self.conversations.shared
            in_use: set[str] = set()
            for c in records.conversations():
                words, thinking = self.conversations.system_text(c), bool(c.get("thinking"))
                first = self.conversations.first_user_text(c)
                in_use |= shared.tags_of(words, thinking, first)
            block_ids += shared.forget_unused(in_use)
        self.vault.unlink_block_files(block_ids)
        records.checkpoint()
        if kind == "document":
            self.routing.forget_document(item_id)
        holding = self.live.holding
        if holding is not None and holding.owner_id in owners:
            self.live.clear(wipe=True)
        return ForgetResult(item_id, kind, conversations, len(block_ids))

    def key_status(self) -> KeyStatus:
        vault = self.vault
        return KeyStatus(
            vault.keystore.backend_name,
            vault.key_id,
            vault.locked,
            str(vault.data_dir),
            vault.retired_key_ids(),
            vault.generation,
        )

    def rotate_key(self) -> RotateResult:
        blocks = self.vault.records.count("blocks")
        old = self.vault.key_id
        new = self.vault.rotate_master_key()
        needing = [b.path for b in custody.stranded_by(self.vault, [old])]
        return RotateResult(new, blocks, old, needing)

    def audit(self, repair: bool = False) -> AuditReport:
        return self.vault.audit(repair=repair)
