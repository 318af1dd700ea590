"""Turn format: how a user turn and a model turn are wrapped in tokens.

The GGUF's own chat template is used when it has one: it is rendered once with sentinel
messages to learn the text around each turn, so a new turn can be appended as tokens without
re-rendering the history. Without a template (the embedded base model), Gemma's turn format.
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
import jinja2.sandbox

_U1, _A1, _U2 = "\x01GALAHAD-USER-1\x01", "\x01GALAHAD-MODEL-1\x01", "\x01GALAHAD-USER-2\x01"


@dataclass(frozen=True)
class TurnFormat:
    user_open: str  # before the user's text
    user_close_model_open: str  # after the user's text, before the model's reply
    model_close: str  # after the model's reply; then the next user_open follows
    source: str

    def as_dict(self) -> dict[str, str]:
        return {
            "user_open": self.user_open,
            "user_close_model_open": self.user_close_model_open,
            "model_close": self.model_close,
            "source": self.source,
        }


GEMMA_TURNS = TurnFormat(
    user_open="<start_of_turn>user\n",
    user_close_model_open="<end_of_turn>\n<start_of_turn>model\n",
    model_close="<end_of_turn>\n",
    source="gemma turn format (the model has no chat template)",
)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def derive_turn_format(template: str, bos_token: str, eos_token: str) -> TurnFormat | None:
    """Learn the turn wrapping from a chat template; None when the template does not fit."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    try:
        rendered = env.from_string(template).render(
            messages=[
                {"role": "user", "content": _U1},
                {"role": "assistant", "content": _A1},
                {"role": "user", "content": _U2},
            ],
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.TemplateError:
        return None
    if bos_token and rendered.startswith(bos_token):
        rendered = rendered[len(bos_token) :]
    try:
        i_u1, i_a1, i_u2 = rendered.index(_U1), rendered.index(_A1), rendered.index(_U2)
    except ValueError:
        return None
    user_open = rendered[:i_u1]
    user_close_model_open = rendered[i_u1 + len(_U1) : i_a1]
    between = rendered[i_a1 + len(_A1) : i_u2]
    tail = rendered[i_u2 + len(_U2) :]
    if not user_open or not between.endswith(user_open) or tail != user_close_model_open:
        return None
    model_close = between[: len(between) - len(user_open)]
    if not model_close:
        return None
    return TurnFormat(user_open, user_close_model_open, model_close, "the model's chat template")
