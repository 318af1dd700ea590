"""The window's chats with tools: a conversation that offers MCP tools declares them in its
system turn (fixed when it starts, like its system prompt: the declarations are part of
every stored state after them), and its turns are the API's tool turns (tool_turns.py): a
reply that calls leaves its model turn open, the results the window ran are read straight
after the calls, and the model goes on in the same turn. Every step is a chain link, so a
conversation with tool calls resumes from its blocks like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import InputError, check_text
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.api_shape import ChatShape, UserTurn
from galahad_desktop.memory.chat.stateless import StatelessChats
from galahad_desktop.memory.chat.system_prompt import system_value
from galahad_desktop.memory.chat.tool_turns import markers_of, tool_records
from galahad_desktop.memory.results import ConversationTool, Tool, ToolRun, TurnResult

NOT_ANSWERED = "Not run: the user wrote a new message instead of answering this call."


class WindowTools:
    def __init__(self, chats: StatelessChats) -> None:
        self.chats = chats
        self.conversations = chats.conversations
        self.live = chats.live

    def offered(self, conversation_id: str) -> list[ConversationTool]:
        """The tools a conversation offers (what its system turn declares)."""
        conv = self.conversations.row(conversation_id)
        return [
            ConversationTool(r["name"], r.get("server", ""), r.get("tool", ""), r["description"])
            for r in self.conversations.system_tools(conv)
        ]

    def runs_tools(self, conversation_id: str) -> bool:
        """Whether the window runs this conversation's tools (an API client's conversation
        declares the client's tools, which only the client runs)."""
        return any(tool.server for tool in self.offered(conversation_id))

    def _tools(self, conversation_id: str) -> tuple[Tool, ...]:
        conv = self.conversations.row(conversation_id)
        return tuple(
            Tool(r["name"], r["description"], r["parameters"])
            for r in self.conversations.system_tools(conv)
        )

    def enable(self, conversation_id: str, tools: Sequence[tuple[str, str, Tool]]) -> None:
        """Offer `tools` ((server, its name for the tool, the tool as the model sees it)) in
        a conversation that has not started; its thoughts are off (a call is read from the
        reply's own tokens)."""
        conv = self.conversations.row(conversation_id)
        if conv["n_messages"] or conv.get("document_id"):
            raise InputError(
                "Tools are chosen when a conversation starts (they are part of its memory "
                "from the first token): start a new chat to use them."
            )
        markers_of(self.live.engine)  # Gemma 3 has no tool syntax: refused by name
        records = tool_records([tool for _server, _name, tool in tools])
        for record, (server, name, _tool) in zip(records, tools, strict=True):
            record.update(server=server, tool=name)
        kind, text = system_value(self.conversations.system_text(conv), records)
        records_db = self.conversations.records
        with self.chats.vault.transaction():
            records_db.update(
                "conversations",
                conversation_id,
                {
                    "system_prompt": kind,
                    "system_enc": records_db.encrypt("conversations", "system_enc", conv, text),
                    "thinking": 0,
                },
            )
            records_db.reseal("conversations", conversation_id)

    def waiting(self, conversation_id: str) -> bool:
        """Whether the conversation's last reply called tools whose results are not in."""
        return self.chats.waits_for_results(self.conversations.row(conversation_id))

    def send(
        self, conversation_id: str, text: str, params: SamplingParams, job: Job = NO_JOB
    ) -> TurnResult:
        """The user's message; the reply may call the conversation's tools. A call still
        waiting for its results is answered "not run" first (its turn is closed)."""
        check_text(text, "The message")
        if not text.strip():
            raise InputError("The message is empty.")
        if self.waiting(conversation_id):
            waiting = self.conversations.messages(conversation_id)[-1].calls
            runs = [ToolRun(c.id, c.name, NOT_ANSWERED, ran=False) for c in waiting]
            self.give_results(conversation_id, runs, params, job, answer=False)
        return self._answer(conversation_id, UserTurn(text), params, job)

    def give_results(
        self,
        conversation_id: str,
        runs: Sequence[ToolRun],
        params: SamplingParams,
        job: Job = NO_JOB,
        answer: bool = True,
    ) -> TurnResult:
        """Give the calls' results back and let the model go on in its turn (which may call
        again); with `answer` False the turn is closed there (the user stopped it)."""
        if not self.waiting(conversation_id):
            raise InputError("The conversation's last reply called no tools.")
        called = self.conversations.messages(conversation_id)[-1].calls
        if [(c.id, c.name) for c in called] != [(r.call_id, r.name) for r in runs]:
            raise InputError("Each call the last reply made needs its result, in order.")
        results = tuple((run.name, run.text) for run in runs)
        if answer:
            return self._answer(conversation_id, UserTurn("", results=results), params, job)
        conv = self.conversations.row(conversation_id)
        counters = Counters()
        try:
            engine, role, said, start, graft = self.chats.read_prompt(
                conv, UserTurn("", results=results), counters, job
            )
            reply_start = len(engine.tokens)
            close = engine.model_close()
            engine.evaluate(close)
            counters.new_tokens += len(close)
            self.chats.commit_step(
                conv, counters, role, said, "", (), start, reply_start, None, "cancelled"
            )
        except BaseException:
            self.live.drop()  # the context holds a step no stored link ends at
            raise
        return self.chats.stored_turn(conversation_id, "", "cancelled", counters, graft)

    def _answer(
        self, conversation_id: str, prompt: UserTurn, params: SamplingParams, job: Job
    ) -> TurnResult:
        conv = self.conversations.row(conversation_id)
        request = ChatShape(
            self.conversations.system_text(conv), (), prompt, self._tools(conv["id"])
        )
        try:
            result, calls = self.chats.answer_prompt(conversation_id, request, params, job)
        except BaseException:
            self.live.drop()
            raise
        return dataclasses.replace(result, calls=calls)


__all__ = ["NOT_ANSWERED", "WindowTools"]
