"""Turns as tokens: what a conversation's ledger appends for each kind of turn.

Built once per engine from its TurnFormat and tokenizer, so every caller wraps turns the same
way. The ledger is append-only: a turn is appended as tokens and history is never
re-rendered. Template text (turn markers) is tokenized with special tokens honoured; user and
document text never is, and never yields a markup token (see markup.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from galahad_desktop.engine.chat_format import TurnFormat
from galahad_desktop.engine.decoding import StopRules, turn_markers
from galahad_desktop.engine.tool_format import ToolMarkers
from galahad_desktop.errors import InputError


class Tokenizer(Protocol):
    def encode_template(self, text: str) -> list[int]: ...

    def encode_text(self, text: str) -> list[int]: ...

    def bos(self) -> list[int]: ...


class Turns:
    def __init__(self, tokenizer: Tokenizer, fmt: TurnFormat) -> None:
        self.tok = tokenizer
        self.format = fmt
        template = tokenizer.encode_template
        self.user_open = template(fmt.user_open)
        self.user_close = template(fmt.user_close)
        self.model_open = template(fmt.model_open)
        self.generation_prompt = template(fmt.generation_prompt)
        self.thinking_prompt = template(fmt.thinking_prompt) if fmt.thinking_prompt else None
        self.model_close = template(fmt.model_close)
        self.thought_open: int | None = None
        self.thought_close: int | None = None
        if fmt.empty_thought:
            empty = template(fmt.empty_thought)
            if len(empty) >= 2:
                self.thought_open, self.thought_close = empty[0], empty[-1]

    def stop_rules(
        self,
        end_of_generation: Callable[[int], bool],
        markup: frozenset[int],
        tools: ToolMarkers | None = None,
    ) -> StopRules:
        """How a reply ends in this format: at an end-of-generation token or at any markup
        token that opens or closes a turn; other markup is never shown, nor is a tool call's
        text."""
        markers = turn_markers(
            [self.user_open, self.user_close, self.model_open, self.model_close], markup
        )
        thought = {t for t in (self.thought_open, self.thought_close) if t is not None}
        return StopRules(
            end_of_generation,
            markers - thought,
            markup - thought,
            self.thought_open,
            self.thought_close,
            # Room to close the turn and open the next one (the proof's probe).
            len(self.model_close) + len(self.model_open) + len(self.probe) + 1,
            tools.call_open if tools else None,
            tools.call_close if tools else None,
        )

    @property
    def probe(self) -> list[int]:
        """The next user turn's opening: evaluated after every checkpoint (the proof)."""
        return self.user_open

    @property
    def supports_thinking(self) -> bool:
        return self.format.supports_thinking and self.thought_open is not None

    def start(
        self, system: str = "", thinking: bool = False, declared: Sequence[int] = ()
    ) -> list[int]:
        """A conversation's first tokens: BOS, the native system turn (when the format has
        one and there is a system prompt, thinking or tools: `declared`, their declarations'
        tokens, after the words as Gemma 4's template puts them), and the first user turn's
        opening."""
        if thinking and not self.supports_thinking:
            raise InputError("This model has no thinking mode.")
        fmt = self.format
        tokens = self.tok.bos()
        if fmt.system_open is not None and (system.strip() or thinking or declared):
            tokens += self.tok.encode_template(fmt.system_open)
            if thinking and fmt.thinking_marker:
                tokens += self.tok.encode_template(fmt.thinking_marker)
            tokens += self.tok.encode_text(system.strip()) + list(declared)
            tokens += self.tok.encode_template(fmt.system_close)
        return tokens + self.user_open

    def user_text(self, text: str, system: str = "", first: bool = False) -> str:
        """The user's text as the turn holds it; a format without a system turn folds the
        system prompt into the first user turn (as Gemma 3's template does)."""
        text = text.strip()
        if first and system.strip() and self.format.system_open is None:
            return f"{system.strip()}{self.format.fold_separator}{text}"
        return text

    def user_turn(self, text: str, thinking: bool = False) -> list[int]:
        """The user's text, the end of the user turn, and the generation prompt (the probe,
        the user turn's opening, is already in the context)."""
        prompt = self.thinking_prompt if thinking and self.thinking_prompt else None
        return (
            self.tok.encode_text(text)
            + self.user_close
            + (prompt if prompt is not None else self.generation_prompt)
        )

    def document_turn(self, content: str, ack: str, opening: bool = True) -> list[int]:
        """The user hands over a document and the model acknowledges it: the block ends at
        a turn boundary like every conversation checkpoint. Without `opening` the turn
        continues a context that already holds the user turn's opening."""
        start = self.tok.bos() + self.user_open if opening else []
        return (
            start
            + self.tok.encode_text(content)
            + self.user_close
            + self.generation_prompt
            + self.tok.encode_text(ack)
            + self.model_close
        )

    def question(self, text: str) -> list[int]:
        """A one-off question on a grafted document (thinking off)."""
        return self.user_turn(text.strip())
