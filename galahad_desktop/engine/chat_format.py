"""Turn format: how system, user and model turns are wrapped in tokens.

The GGUF's own chat template is used when it has one: it is rendered a few times with
sentinel messages to learn the text around each kind of turn (and, for templates that have
them, the native system turn, the thinking switch and the empty thought channel that ends the
generation prompt when thinking is off), so a new turn can be appended as tokens without ever
re-rendering the history. Without a template (the embedded base model), Gemma 3's turn format.
A template that cannot be understood is never a silent fallback: the format says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.sandbox

_S, _U1, _A1, _U2 = (
    "\x01GALAHAD-SYSTEM\x01",
    "\x01GALAHAD-USER-1\x01",
    "\x01GALAHAD-MODEL-1\x01",
    "\x01GALAHAD-USER-2\x01",
)
FROM_TEMPLATE = "the model's chat template"
NO_TEMPLATE = "Gemma 3 turn format (the model has no chat template)"


@dataclass(frozen=True)
class TurnFormat:
    user_open: str  # before the user's text
    user_close: str  # after the user's text
    model_open: str  # a model turn's opening as the history holds it
    generation_prompt: str  # appended after user_close to let the model answer
    model_close: str  # after the model's reply; then the next user_open follows
    source: str
    system_open: str | None = None  # None: a system prompt is folded into the first user turn
    system_close: str = ""
    fold_separator: str = "\n\n"  # between a folded system prompt and the first user text
    thinking_marker: str | None = None  # opens the system turn when thinking is on
    thinking_prompt: str | None = None  # generation prompt when thinking is on
    empty_thought: str = ""  # generation prompt minus model_open when thinking is off
    understood: bool = True  # False: the model has a template this code could not read
    problem: str = ""  # why the template could not be used

    @property
    def user_close_model_open(self) -> str:
        """What follows the user's text when the model is to answer (thinking off)."""
        return self.user_close + self.generation_prompt

    @property
    def native_system(self) -> bool:
        return self.system_open is not None

    @property
    def supports_thinking(self) -> bool:
        return self.thinking_prompt is not None and self.thinking_marker is not None

    def describe(self) -> str:
        if not self.understood:
            return (
                f"the model's chat template could not be understood ({self.problem}); "
                f"using the {NO_TEMPLATE.split(' (')[0]} instead"
            )
        return self.source

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["user_close_model_open"] = self.user_close_model_open
        out["native_system"] = self.native_system
        out["supports_thinking"] = self.supports_thinking
        return out


GEMMA3_TURNS = TurnFormat(
    user_open="<start_of_turn>user\n",
    user_close="<end_of_turn>\n",
    model_open="<start_of_turn>model\n",
    generation_prompt="<start_of_turn>model\n",
    model_close="<end_of_turn>\n",
    source=NO_TEMPLATE,
)


# What derive_turn_format reads from Gemma 4's chat template (checked against the Gemma 4
# test model, which carries the published template: tests/test_gemma4.py); the fast tier's
# fake engine speaks it.
GEMMA4_TURNS = TurnFormat(
    user_open="<|turn>user\n",
    user_close="<turn|>\n",
    model_open="<|turn>model\n",
    generation_prompt="<|turn>model\n<|channel>thought\n<channel|>",
    model_close="<turn|>\n",
    source=FROM_TEMPLATE,
    system_open="<|turn>system\n",
    system_close="<turn|>\n",
    thinking_marker="<|think|>\n",
    thinking_prompt="<|turn>model\n",
    empty_thought="<|channel>thought\n<channel|>",
)


class TemplateNotUnderstood(Exception):
    """The template renders, but not into turns this code can append one at a time."""


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _render(template: jinja2.Template, messages: list[dict[str, str]], **extra: Any) -> str:
    return template.render(messages=messages, **extra)


def derive_turn_format(template_text: str, bos_token: str, eos_token: str) -> TurnFormat:
    """Learn the turn wrapping from a chat template. Raises TemplateNotUnderstood (with the
    reason) when the template does not fit an append-only ledger of turns."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        template = env.from_string(template_text)
    except jinja2.TemplateError as exc:
        raise TemplateNotUnderstood(f"it does not parse: {exc}") from None
    base = {"bos_token": bos_token, "eos_token": eos_token}

    def render(messages: list[dict[str, str]], generation: bool, **extra: Any) -> str:
        try:
            text = _render(template, messages, add_generation_prompt=generation, **base, **extra)
        except jinja2.TemplateError as exc:
            raise TemplateNotUnderstood(f"rendering failed: {exc}") from None
        except Exception as exc:  # a template can fail in any way the sandbox allows
            raise TemplateNotUnderstood(f"rendering failed: {type(exc).__name__}") from None
        return text[len(bos_token) :] if bos_token and text.startswith(bos_token) else text

    user1, model1, user2 = (
        {"role": "user", "content": _U1},
        {"role": "assistant", "content": _A1},
        {"role": "user", "content": _U2},
    )
    full = render([user1, model1, user2], True)
    try:
        i_u1, i_a1, i_u2 = full.index(_U1), full.index(_A1), full.index(_U2)
    except ValueError:
        raise TemplateNotUnderstood("the messages do not appear in order") from None
    user_open = full[:i_u1]
    between_user_model = full[i_u1 + len(_U1) : i_a1]
    between_model_user = full[i_a1 + len(_A1) : i_u2]
    tail = full[i_u2 + len(_U2) :]
    alone = render([user1], False)
    if not alone.startswith(user_open + _U1):
        raise TemplateNotUnderstood("a lone user turn renders differently")
    user_close = alone[len(user_open) + len(_U1) :]
    if not user_open or not user_close:
        raise TemplateNotUnderstood("user turns have no markers")
    if not between_user_model.startswith(user_close) or not tail.startswith(user_close):
        raise TemplateNotUnderstood("a user turn does not end the same way each time")
    model_open = between_user_model[len(user_close) :]
    generation_prompt = tail[len(user_close) :]
    if not between_model_user.endswith(user_open):
        raise TemplateNotUnderstood("a model turn is not followed by the next user turn")
    model_close = between_model_user[: len(between_model_user) - len(user_open)]
    if not model_close or not generation_prompt.startswith(model_open):
        raise TemplateNotUnderstood("model turns have no closing marker")

    system = _system_turn(render, user1, user_open)
    thinking = _thinking(render, user1, user_close, model_open, system)
    return TurnFormat(
        user_open=user_open,
        user_close=user_close,
        model_open=model_open,
        generation_prompt=generation_prompt,
        model_close=model_close,
        source=FROM_TEMPLATE,
        system_open=system[0],
        system_close=system[1],
        fold_separator=system[2],
        thinking_marker=thinking[0],
        thinking_prompt=thinking[1],
        empty_thought=generation_prompt[len(model_open) :] if thinking[1] else "",
    )


def _system_turn(render: Any, user1: dict[str, str], user_open: str) -> tuple[str | None, str, str]:
    """(system_open, system_close, fold separator). Gemma 4 has a native system turn;
    Gemma 3's template folds the system prompt into the first user turn."""
    try:
        text = render([{"role": "system", "content": _S}, user1], False)
    except TemplateNotUnderstood:
        return None, "", "\n\n"  # the template refuses a system message: fold it ourselves
    if _S not in text or _U1 not in text:
        return None, "", "\n\n"
    i_s, i_u = text.index(_S), text.index(_U1)
    before = text[:i_s]
    if i_s > i_u:
        return None, "", "\n\n"
    if before == user_open:  # folded into the user turn
        return None, "", text[i_s + len(_S) : i_u]
    if user_open in before:
        raise TemplateNotUnderstood("the system prompt is placed in an unknown way")
    after = text[i_s + len(_S) : i_u]
    if not after.endswith(user_open):
        raise TemplateNotUnderstood("the system turn is not followed by the user turn")
    return before, after[: len(after) - len(user_open)], "\n\n"


def _thinking(
    render: Any,
    user1: dict[str, str],
    user_close: str,
    model_open: str,
    system: tuple[str | None, str, str],
) -> tuple[str | None, str | None]:
    """(marker at the top of the system turn, generation prompt) when thinking is on; both
    None when the template has no thinking switch."""
    system_open = system[0]
    if system_open is None:
        return None, None
    plain = render([user1], True)
    thinking = render([user1], True, enable_thinking=True)
    if plain == thinking:
        return None, None
    with_system = render([{"role": "system", "content": _S}, user1], False, enable_thinking=True)
    if not with_system.startswith(system_open) or _S not in with_system:
        return None, None
    marker = with_system[len(system_open) : with_system.index(_S)]
    position = thinking.rfind(_U1)
    tail = thinking[position + len(_U1) :]
    if not marker or not tail.startswith(user_close):
        return None, None
    prompt = tail[len(user_close) :]
    if not prompt.startswith(model_open):
        return None, None
    return marker, prompt
