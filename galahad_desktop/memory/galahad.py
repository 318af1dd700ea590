"""The core's one API: what the window and the `galahad` command both call.

`Galahad` opens one data directory (vault, catalog, settings) and one engine, and hands each
request to the room that holds it: conversations, documents, routing, chains, the verified
library, import and export, continuation, maintenance. Results are typed values
(memory/results.py). Not thread-safe: one thread owns it (the window's worker thread, or the
command's main thread).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from galahad_desktop.engine.gguf import inspect_gguf
from galahad_desktop.engine.modelinfo import ModelInfo, check_model_file
from galahad_desktop.engine.picture import Media
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import EngineConfig
from galahad_desktop.errors import InputError, ModelError, check_text, user_path
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.chains import Chains
from galahad_desktop.memory.chat.continuation import Continuation
from galahad_desktop.memory.chat.conversations import Conversations
from galahad_desktop.memory.chat.live import LiveContext, Rendered
from galahad_desktop.memory.chat.search import Search
from galahad_desktop.memory.chat.stateless import PLAIN_REPLY, StatelessChats
from galahad_desktop.memory.chat.system_prompt import own_sampling, set_sampling
from galahad_desktop.memory.chat.turning import ConversationTurns
from galahad_desktop.memory.chat.window_tools import WindowTools
from galahad_desktop.memory.documents.documents import Documents
from galahad_desktop.memory.facade_documents import DocumentFacade
from galahad_desktop.memory.facade_store import StoreFacade
from galahad_desktop.memory.facade_tools import ToolFacade
from galahad_desktop.memory.maintenance import Maintenance
from galahad_desktop.memory.model_files import ModelDownloads, ModelShelf, engine_config, same_file
from galahad_desktop.memory.results import (
    AskResult,
    ChatCompletion,
    ChatMessage,
    CompactResult,
    ContextFull,
    Continued,
    ConversationSummary,
    EngineInfo,
    ExportResult,
    GraftReport,
    ImportResult,
    Message,
    ModelFile,
    OpenedConversation,
    ReplyShape,
    ReplyVersion,
    SearchHit,
    TurnResult,
)
from galahad_desktop.memory.retrieval.router import RouteDecision
from galahad_desktop.memory.retrieval.routing import Routing, RoutingLogEntry
from galahad_desktop.memory.storage import Storage
from galahad_desktop.memory.tool_servers import ToolServers
from galahad_desktop.memory.transfer.transfer import Transfer
from galahad_desktop.memory.usage import Usage
from galahad_desktop.memory.verified.library import VerifiedLibrary
from galahad_desktop.models import catalog as model_catalog
from galahad_desktop.models.hub import Downloaded
from galahad_desktop.paths import default_model_path
from galahad_desktop.settings import SETTINGS, SYSTEM_PROMPTS, Setting, Settings, coerce
from galahad_desktop.vault import restoring
from galahad_desktop.vault.keys import KeyStorage, KeyStore, key_storage, open_keystore
from galahad_desktop.vault.names import BlockRow
from galahad_desktop.vault.vault import Vault

EngineFactory = Callable[[EngineConfig, Path | None], ChatEngine]


def _llama_engine(config: EngineConfig, hash_cache: Path | None) -> ChatEngine:
    """The real engine. llama.cpp is imported here, when a model opens (on the worker's
    thread in the window), never when the facade is imported: the window shows first."""
    from galahad_desktop.engine.engine import Engine

    return Engine(config, hash_cache=hash_cache)


class RoomSources:
    """What the live context asks of the rooms built on it (live.LiveSources): they are
    made after it, from it, so it reaches them through the façade that holds them all."""

    def __init__(self, core: Galahad) -> None:
        self.core = core

    def chain_owners(self, owner_id: str) -> set[str]:
        return self.core.conversations.chain_owners(owner_id)

    def ledger_for_model(self, row: BlockRow) -> Rendered | None:
        return self.core.maintenance.ledger_for_model(row)

    def pictures_for(self, row: BlockRow) -> list[Media]:
        return self.core.maintenance.pictures_for(row)


class Galahad(DocumentFacade, StoreFacade, ToolFacade):
    """One data directory and one engine. Not thread-safe: one thread owns it."""

    @staticmethod
    def key_storage(data_dir: Path) -> KeyStorage:
        """Before opening: ("keyring" | "passphrase" | "unavailable", why unavailable)."""
        return key_storage(Path(data_dir))

    def __init__(
        self,
        data_dir: Path,
        model_path: Path | None = None,
        keystore: KeyStore | None = None,
        overrides: dict[str, Any] | None = None,
        passphrase: str | None = None,
        engine_factory: EngineFactory | None = None,
        lock_timeout_s: float = 10.0,
    ) -> None:
        self.data_dir = Path(data_dir)
        # Before anything touches the directory (a passphrase keystore writes into it): a
        # restore interrupted last time is finished or rolled back first.
        note, finished = restoring.recover_restore(user_path(self.data_dir))
        if keystore is None:
            keystore = open_keystore(self.data_dir, passphrase)
        self.vault = Vault(
            self.data_dir,
            keystore,
            lock_timeout_s,
            accept_older=finished,
            recovered=(note,) if note else (),
        )
        try:
            self.settings = Settings(self.data_dir)
            if overrides:
                self.settings.override(overrides)
        except BaseException:
            self.vault.close()
            raise
        self.model_path = model_path
        factory = engine_factory or _llama_engine
        hashes = self.data_dir / "model-hashes.json"
        self.live = LiveContext(
            self.vault,
            self.settings,
            lambda: factory(engine_config(self.settings, self.model_path), hashes),
            RoomSources(self),
            hashes,
        )
        self.conversations = Conversations(self.live)
        self.turns = ConversationTurns(self.live, self.conversations)
        self.documents = Documents(
            self.live,
            self.conversations,
            self.turns,
            lambda parts: self.routing.parts_added(parts),
        )
        self.routing = Routing(self.live, self.documents)
        self.chains = Chains(self.live, self.conversations)
        self.library = VerifiedLibrary(self.live, self.conversations, self.turns)
        self.transfer = Transfer(self.live, self.conversations)
        self.continuation = Continuation(self.live, self.conversations, self.turns)
        self.maintenance = Maintenance(
            self.live, self.conversations, self.documents, self.routing, self.library
        )
        self.usage = Usage(self.live)
        self.stateless = StatelessChats(
            self.live,
            self.conversations,
            self.turns,
            self.maintenance.forget,
            self.documents.add_sent_picture,
        )
        self.window_tools = WindowTools(self.stateless)
        self.tool_servers_room = ToolServers(self.vault)
        self.finder = Search(self.conversations)
        self.storage_room = Storage(self.live, self.conversations, self.documents)
        self.live.room_for = self.storage_room.make_room
        self.live.fits = self.storage_room.check_fits
        self.shelf = ModelShelf(self.data_dir, self.settings, model_path)
        self.vault.recovered += self.stateless.remove_abandoned()

    # -- lifecycle -----------------------------------------------------------------------
    def start_notes(self) -> list[str]:
        """What opening the data directory repaired (an interrupted restore or backup), in
        words: the front ends say it once."""
        return list(self.vault.recovered)

    @property
    def engine(self) -> ChatEngine:
        """The engine, loaded on first use (one thread owns it)."""
        return self.live.engine

    def close(self) -> None:
        """Free the engine's native memory and close the vault (the data directory is
        released)."""
        self.routing.drop_index()
        self.live.close()
        self.vault.close()

    def lock(self) -> None:
        """Drop keys and decrypted state from memory until unlock()."""
        self.finder.clear()
        self.routing.drop_index()
        self.live.clear(wipe=True)
        self.vault.lock()

    def unlock(self) -> None:
        """Open the vault again after `lock` (the keys are read from the keystore)."""
        self.vault.unlock()

    def reload_engine(self) -> None:
        """Load the engine again with the current settings (after a change that needs it)."""
        self.live.reload()

    # -- the model and settings ----------------------------------------------------------
    def sampling(self, conversation_id: str | None = None, **changes: Any) -> SamplingParams:
        """Settings over the model publisher's recommendation, a conversation's own values
        over those, explicit changes over all."""
        params: dict[str, Any] = self.engine.sampling_defaults().as_dict()
        for key in ("temperature", "top_p", "top_k", "max_tokens", "seed"):
            value = self.settings.get(key)
            if value is not None:
                params[key] = value
        if conversation_id is not None:
            params.update(own_sampling(self.conversations.row(conversation_id)))
        # Explicit values pass the settings' own checks (a NaN temperature or a negative
        # seed is a clear error naming the option, never a crash inside the sampler).
        params.update({k: coerce(k, v) for k, v in changes.items() if v is not None})
        return SamplingParams(**params)

    def info(self) -> EngineInfo:
        """What the running model is and where it runs: model, fingerprint, backend, turn
        format, vision."""
        engine = self.engine
        fmt = engine.turn_format
        return EngineInfo(
            model=engine.model_info(),
            fingerprint=engine.fingerprint,
            fingerprint_details=engine.fingerprint_details,
            backend=engine.backend,
            gpu_layers=engine.gpu_layers,
            n_ctx=engine.n_ctx,
            turn_format=fmt,
            turn_format_note=fmt.describe(),
            sampling_defaults=engine.sampling_defaults(),
            keyring=self.vault.keystore.backend_name,
            supports_thinking=engine.turns.supports_thinking,
            settings_problems=list(self.settings.problems),
            routing=self.routing.describe(),
            placement=engine.placement,
            vision=self.vision_status(),
        )

    @staticmethod
    def stored_settings(data_dir: Path) -> dict[str, Any]:
        """The data directory's settings as stored (read at once, for a dialog that must
        open filled while the core is busy)."""
        return Settings(Path(data_dir)).as_dict()

    def settings_values(self) -> dict[str, Any]:
        """The settings as they are now (stored values over defaults)."""
        return self.settings.as_dict()

    @staticmethod
    def declared_settings() -> tuple[Setting, ...]:
        """Every setting: key, type, default, description, range."""
        return SETTINGS

    @staticmethod
    def check_settings(changes: dict[str, Any]) -> None:
        """What only the world can say about settings, checked when they are saved rather
        than on the next model command: a missing or non-GGUF model or projector file, a
        device server that does not answer llama.cpp's handshake."""
        for key in ("model_path", "embedding_model", "projector"):
            model = changes.get(key)
            if isinstance(model, str) and model.strip():
                try:
                    check_model_file(user_path(model))
                except ModelError as exc:
                    raise InputError(f"Not saved ({key}): {exc}") from None
        servers = changes.get("rpc_servers")
        if isinstance(servers, str):
            for endpoint in (e.strip() for e in servers.split(",") if e.strip()):
                from galahad_desktop.engine.devices import probe_rpc_server  # llama.cpp

                try:
                    probe_rpc_server(endpoint)
                except ModelError as exc:
                    raise InputError(f"Not saved (rpc_servers): {exc}") from None

    def update_settings(self, changes: dict[str, Any]) -> bool:
        """Save settings; a change to the runtime reloads the engine (blocks re-read once)."""
        self.check_settings(changes)
        changed = self.settings.update(changes)
        if changed:
            self.reload_engine()
        return bool(changed)

    @staticmethod
    def inspect_model(path: Path) -> ModelInfo:
        """What a GGUF file is (architecture, size, context, turn format) without loading
        it."""
        return inspect_gguf(Path(path), same_file(Path(path), default_model_path()))

    def use_model(self, path: Path | None) -> bool:
        """Switch to a model file (None: the embedded one); conversations made with another
        model are re-read once under it, from their text."""
        return self.update_settings({"model_path": str(path) if path else ""})

    def model_files(self) -> list[ModelFile]:
        """The model files this data directory knows and the one in use."""
        return self.shelf.files()

    @staticmethod
    def recommend(n_ctx: int = 8192) -> model_catalog.Recommendation:
        """The Gemma 4 size that fits this machine, with every size's needs."""
        return model_catalog.recommend(n_ctx)

    def download_model(
        self, repo: str, filename: str, job: Job = NO_JOB, use: bool = False
    ) -> Downloaded:
        """Download a GGUF from the Hub into the models folder (resumable, SHA-256 checked);
        `use` switches to it."""
        done = self.shelf.download(repo, filename, job)
        if use:
            self.use_model(done.path)
        return done

    def get_gemma4(
        self, size: str | None = None, job: Job = NO_JOB, use: bool = True
    ) -> Downloaded:
        """Download the Gemma 4 size chosen (default: the one recommended for this machine)."""
        chosen = self.shelf.gemma4_for(size)
        return self.download_model(chosen.repo, chosen.file, job, use)

    # -- conversations -------------------------------------------------------------------
    def new_conversation(
        self,
        document_id: str | None = None,
        title: str = "",
        system_prompt: str | None = None,
        thinking: bool | None = None,
    ) -> str:
        """A new, empty conversation (on a document when given: its block is the chain's
        root)."""
        return self.conversations.create(document_id, title, system_prompt, thinking)

    def list_conversations(self) -> list[ConversationSummary]:
        """Every conversation's summary, newest first (a damaged record is listed and
        marked)."""
        return self.conversations.summaries()

    def search(self, query: str, limit: int = 200) -> list[SearchHit]:
        """Conversations whose titles or messages match the words (searched in memory, never
        on disk)."""
        return self.finder.find(query, limit)

    def conversation(self, conversation_id: str) -> ConversationSummary:
        """One conversation's summary (title, counts, memory state); its seal is checked."""
        return self.conversations.summary(self.conversations.row(conversation_id))

    def messages(self, conversation_id: str) -> list[Message]:
        """A conversation's transcript, checked against its seal first."""
        return self.conversations.messages(conversation_id)

    def rename(self, conversation_id: str, title: str) -> ConversationSummary:
        """Give a conversation a new title (encrypted)."""
        return self.conversations.rename(conversation_id, title)

    def set_thinking(self, conversation_id: str, enabled: bool) -> None:
        """Turn thinking on or off for a conversation that has not started yet."""
        self.conversations.set_thinking(conversation_id, enabled)

    def head_block(self, conversation_id: str) -> str:
        """The block a conversation would be grafted from now."""
        return self.conversations.head_block(conversation_id)

    def resume(self, conversation_id: str, job: Job = NO_JOB) -> GraftReport:
        """Graft a conversation's latest checkpoint from disk and prove it; says what it
        cost."""
        report = self.turns.resume(conversation_id, job)
        self.usage.record_graft(report)
        return report

    def open_conversation(self, conversation_id: str, job: Job = NO_JOB) -> OpenedConversation:
        """Resume a conversation (graft its head from disk) and say what the window shows."""
        row = self.conversations.row(conversation_id)
        other = bool(row.get("model_sha256")) and row["model_sha256"] != self.engine.model_sha256
        report = self.resume(conversation_id, job)
        messages = self.messages(conversation_id)
        own = (
            self.documents.name(self.documents.row(row["document_id"]))
            if row["document_id"]
            else ""
        )
        return OpenedConversation(
            self.conversation(conversation_id),
            messages,
            report,
            len(self.engine.tokens),
            self.engine.n_ctx,
            self.library_enabled(conversation_id),
            other,
            tuple([own] if own else []) + tuple(m.text for m in messages if m.role == "document"),
        )

    def send(
        self,
        conversation_id: str | None,
        text: str,
        job: Job = NO_JOB,
        params: SamplingParams | None = None,
        compact: bool = False,
        thinking: bool | None = None,
        system_prompt: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        tools: Sequence[str] = (),
    ) -> TurnResult:
        """One turn, through the verified-answer library when the conversation uses it, or
        offering its tools (the window and the command take this same path). Without a
        conversation, a new one is made with this first turn (offering the tools of the MCP
        servers named): a turn that fails leaves no conversation behind."""
        if conversation_id is None:
            check_text(text, "The message")
            if not text.strip():
                raise InputError("The message is empty.")
            conversation_id = self.conversations.create(
                system_prompt=system_prompt, thinking=thinking
            )
            try:
                if temperature is not None or max_tokens is not None:
                    set_sampling(self.vault, conversation_id, temperature, max_tokens)
                if tools:
                    self.use_tools(conversation_id, tools, job)
                result = self._turn(conversation_id, text, params, job)
            except BaseException:
                self.maintenance.forget(conversation_id)
                raise
            return self._after_turn(result, compact)
        return self._after_turn(self._turn(conversation_id, text, params, job), compact)

    def _turn(
        self, conversation_id: str, text: str, params: SamplingParams | None, job: Job
    ) -> TurnResult:
        params = params or self.sampling(conversation_id)
        if self.window_tools.runs_tools(conversation_id):
            return self.window_tools.send(conversation_id, text, params, job)
        return self.library.ask(conversation_id, text, params, job)

    def set_conversation_sampling(
        self, conversation_id: str, temperature: float | None, max_tokens: int | None
    ) -> dict[str, Any]:
        """A conversation's own creativity and longest reply (None: the settings'); returns
        what it now sets."""
        self.conversations.check(conversation_id)
        set_sampling(self.vault, conversation_id, temperature, max_tokens)
        return self.conversation_sampling(conversation_id)

    def conversation_sampling(self, conversation_id: str) -> dict[str, Any]:
        """What a conversation sets over the settings (temperature, max_tokens)."""
        return own_sampling(self.conversations.row(conversation_id))

    def conversation_system_prompt(self, conversation_id: str) -> str:
        """The words of a conversation's system prompt (its own, or its preset's)."""
        return self.conversations.system_text(self.conversations.row(conversation_id))

    @staticmethod
    def system_prompt_presets() -> dict[str, str]:
        """The built-in system prompts, by name: starting points for the user's own."""
        return dict(SYSTEM_PROMPTS)

    def reply_versions(self, conversation_id: str, seq: int) -> list[ReplyVersion]:
        """Every version of the reply at message `seq`, oldest first (Regenerate keeps
        the earlier ones)."""
        return self.conversations.versions.of_reply(conversation_id, seq)

    def choose_version(
        self, conversation_id: str, number: int, job: Job = NO_JOB
    ) -> OpenedConversation:
        """Continue the conversation from version `number` of its last reply: that
        version's own block is grafted (0 tokens re-read) and proved."""
        self.conversations.versions.choose(conversation_id, number)
        return self.open_conversation(conversation_id, job)

    def regenerate(
        self,
        conversation_id: str,
        job: Job = NO_JOB,
        params: SamplingParams | None = None,
        compact: bool = False,
    ) -> TurnResult:
        """Answer the last message again from the checkpoint before it; the earlier reply is
        kept as a version."""
        params = params or self.sampling(conversation_id)
        result = self.turns.regenerate(conversation_id, params, job)
        return self._after_turn(result, compact)

    def branch(
        self,
        conversation_id: str,
        seq: int,
        new_text: str,
        job: Job = NO_JOB,
        params: SamplingParams | None = None,
    ) -> TurnResult:
        """Edit user message `seq` and continue in a new conversation; the history before it
        is grafted, not re-read."""
        result = self.turns.branch(
            conversation_id,
            seq,
            new_text,
            params or self.sampling(conversation_id),  # the branch keeps its choices
            job,
        )
        return self._after_turn(result, False)

    def _after_turn(self, result: TurnResult, compact: bool) -> TurnResult:
        self.usage.record_turn(result)
        if compact and self.chains.needs_compaction(result.conversation_id):
            result.compaction = self.chains.compact(result.conversation_id)
        return result

    def chain_links(self, conversation_id: str) -> int:
        """How many links the conversation's chain has (compaction merges old ones)."""
        return self.chains.links(conversation_id)

    def compact(self, conversation_id: str, keep: int | None = None) -> CompactResult:
        """Merge the conversation's older chain links into one block (`keep`: the newest
        links kept apart)."""
        return self.chains.compact(conversation_id, keep)

    # -- import, export, a full context ------------------------------------------------------
    def import_conversations(self, path: Path, job: Job = NO_JOB) -> ImportResult:
        """Import conversations from ChatGPT, Jan, LM Studio, Open WebUI or Markdown; each
        is read once and stored."""
        return self.transfer.import_file(Path(path), job)

    def export(
        self, conversation_id: str, fmt: str, out: Path | None = None, force: bool = False
    ) -> ExportResult:
        """`force` replaces an existing file (the window's save dialog asked already)."""
        return self.transfer.export(conversation_id, fmt, out, force)

    def context_check(self, conversation_id: str, text: str) -> ContextFull | None:
        """None when the next message fits; else what the user can choose."""
        return self.continuation.check(conversation_id, text)

    def continue_with_summary(self, conversation_id: str, job: Job = NO_JOB) -> Continued:
        """A full conversation continued in a new one that starts from a summary of it."""
        return self.continuation.with_summary(conversation_id, self.sampling(conversation_id), job)

    def continue_with_recent(self, conversation_id: str, text: str, job: Job = NO_JOB) -> Continued:
        """A full conversation continued in a new one that grafts or re-reads only its
        recent turns."""
        return self.continuation.with_recent(conversation_id, text, job)

    def branch_with_system_prompt(
        self, conversation_id: str, words: str, job: Job = NO_JOB
    ) -> Continued:
        """The conversation again from its start under other system words, in a new branch
        (every turn re-read: the words come first); the original stays."""
        return self.continuation.with_system_prompt(conversation_id, words, job)

    # -- routing -------------------------------------------------------------------------
    def route(self, question: str, document_id: str | None = None) -> RouteDecision:
        """Which document part a question goes to, with the scores and margin (or unsure)."""
        return self.routing.route(question, document_id)

    def ask(
        self,
        question: str,
        document_id: str | None = None,
        part_id: str | None = None,
        job: Job = NO_JOB,
        params: SamplingParams | None = None,
    ) -> AskResult:
        """Answer a question on a stored document (routed to its best part) or on the whole
        library, re-reading nothing stored."""
        result = self.routing.ask(question, document_id, part_id, params or self.sampling(), job)
        if result.graft is not None:
            self.usage.record_graft(result.graft)
        return result

    def routing_log(self, limit: int = 100) -> list[RoutingLogEntry]:
        """The router's recent decisions (scores and margins, never the questions)."""
        return self.routing.routing_log(limit)

    def citation(self, part_id: str) -> str:
        """The words of a stored document part (what an answer cites)."""
        return self.routing.citation(part_id)

    # -- the local API server --------------------------------------------------------------
    def complete_chat(
        self,
        messages: Sequence[ChatMessage],
        job: Job = NO_JOB,
        stop: Sequence[str] = (),
        reply: ReplyShape = PLAIN_REPLY,
        **sampling: Any,
    ) -> ChatCompletion:
        """One OpenAI-style chat request: the stored history is grafted (proof checked), only
        what is new is read, the reply (held to `reply` by grammar) is stored as the next
        turn. `sampling`: temperature, top_p, max_tokens, seed (the settings' checks)."""
        params = dataclasses.replace(self.sampling(None, **sampling), stop=tuple(stop))
        completion = self.stateless.complete(messages, params, job, reply)
        self.usage.record_turn(completion.turn)
        return completion

    def api_key(self, rotate: bool = False) -> str:
        """The local server's bearer key (made on first use, kept in the keyring)."""
        return "gk-" + base64.urlsafe_b64encode(self.vault.api_key(rotate)).decode().rstrip("=")


__all__ = [
    "EngineInfo",
    "Galahad",
    "ModelDownloads",
    "ModelFile",
    "OpenedConversation",
    "engine_config",
]
