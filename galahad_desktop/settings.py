"""Every setting declared once: key, type, default, description (and whether it changes the bits).

Settings live in `settings.json` in the data directory. They hold no private data (the
system prompt, which might, is not a setting here). Unknown keys and wrong types are refused
with a message naming the key.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from galahad_desktop.errors import InputError
from galahad_desktop.vault.atomic import atomic_write_bytes


@dataclass(frozen=True)
class Setting:
    key: str
    type: type
    default: Any
    description: str
    runtime: bool  # True when a change alters the runtime fingerprint (stored blocks re-read)
    choices: tuple[Any, ...] | None = None
    minimum: int | float | None = None


def _default_threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "model_path",
        str,
        "",
        "GGUF model file; empty means the embedded Gemma 3 270M.",
        runtime=True,
    ),
    Setting("n_ctx", int, 8192, "Context size in tokens.", runtime=True, minimum=512),
    Setting(
        "n_gpu_layers",
        int,
        -1,
        "Layers offloaded to the GPU; -1 means all when the build has a GPU backend.",
        runtime=True,
        minimum=-1,
    ),
    Setting(
        "n_threads", int, _default_threads(), "CPU threads for evaluation.", runtime=True, minimum=1
    ),
    Setting(
        "n_batch", int, 512, "Logical batch size for prompt evaluation.", runtime=True, minimum=32
    ),
    Setting(
        "n_ubatch", int, 512, "Physical batch size for prompt evaluation.", runtime=True, minimum=32
    ),
    Setting("flash_attn", bool, False, "Use flash attention.", runtime=True),
    Setting(
        "kv_type",
        str,
        "f16",
        "KV cache element type.",
        runtime=True,
        choices=("f16", "f32", "q8_0"),
    ),
    Setting(
        "swa_full",
        bool,
        True,
        # Measured: with a ring-buffer SWA cache, cell order after a long prefill differs
        # from a restore and the proof is only `close`; block size is the same either way.
        "Full-size sliding-window cache: needed for byte-exact grafts; uses more RAM.",
        runtime=True,
    ),
    Setting(
        "chain_blocks",
        bool,
        True,
        "Store each turn as a child block holding only its new tokens (a chain); off stores "
        "the whole state every turn.",
        runtime=False,
    ),
    Setting(
        "compact_after",
        int,
        24,
        "Merge a conversation's chain into one block (in the background) once it has more "
        "links than this; the newest `checkpoints` turns stay separate.",
        runtime=False,
        minimum=4,
    ),
    Setting(
        "checkpoints",
        int,
        8,
        "Turn boundaries kept as their own links when a chain is compacted (regenerate and "
        "edit restore them; an older turn is re-read).",
        runtime=False,
        minimum=2,
    ),
    Setting(
        "part_tokens",
        int,
        0,
        "Tokens per part of a long document; 0 fits each part in the context with room "
        "for a question and its answer.",
        runtime=False,
        minimum=0,
    ),
    Setting(
        "part_overlap",
        int,
        64,
        "Tokens of the previous part repeated at the start of the next one.",
        runtime=False,
        minimum=0,
    ),
    Setting(
        "route_min_strength",
        float,
        0.5,
        "Router: the least share of the question (its words and word pairs, weighted by "
        "rarity) the best part must hold to answer without asking.",
        runtime=False,
        minimum=0.0,
    ),
    Setting(
        "route_min_margin",
        float,
        1.5,
        "Router: how many times the runner-up's share the best part must hold.",
        runtime=False,
        minimum=1.0,
    ),
    Setting(
        "system_prompt",
        str,
        "none",
        "System prompt preset for new conversations (folded into the first turn).",
        runtime=False,
        choices=("none", "concise", "coder", "tutor", "translator"),
    ),
    Setting(
        "temperature", float, 0.0, "Sampling temperature; 0 is greedy.", runtime=False, minimum=0.0
    ),
    Setting("top_p", float, 0.95, "Nucleus sampling mass.", runtime=False, minimum=0.0),
    Setting(
        "top_k",
        int,
        40,
        "Sample among the k most likely tokens; 0 disables.",
        runtime=False,
        minimum=0,
    ),
    Setting("max_tokens", int, 256, "Most tokens generated per reply.", runtime=False, minimum=1),
    Setting("seed", int, 0, "Random seed for sampling.", runtime=False),
)

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}

# Built-in presets: product text, not user data, so they may live in plain settings.
SYSTEM_PROMPTS: dict[str, str] = {
    "none": "",
    "concise": "You are a helpful assistant. Answer briefly and precisely.",
    "coder": "You are an expert programmer. Answer with correct, idiomatic code and short "
    "explanations; use fenced code blocks.",
    "tutor": "You are a patient tutor. Explain step by step and check understanding.",
    "translator": "You translate the user's text faithfully; reply with the translation only.",
}


def coerce(key: str, value: Any) -> Any:
    """Check and convert one value; raise InputError naming the key when it does not fit."""
    setting = BY_KEY.get(key)
    if setting is None:
        raise InputError(f"Unknown setting '{key}'. Known settings: {', '.join(BY_KEY)}.")
    try:
        if setting.type is bool:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(value)
                converted: Any = lowered in ("1", "true", "yes", "on")
            else:
                converted = bool(value)
        elif setting.type is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        else:
            converted = setting.type(value)
    except (TypeError, ValueError):
        raise InputError(
            f"Setting '{key}' must be of type {setting.type.__name__}, got {value!r}."
        ) from None
    if setting.choices is not None and converted not in setting.choices:
        raise InputError(f"Setting '{key}' must be one of {', '.join(map(str, setting.choices))}.")
    if setting.minimum is not None and converted < setting.minimum:
        raise InputError(f"Setting '{key}' must be at least {setting.minimum}, got {converted}.")
    return converted


class Settings:
    """The settings of one data directory, backed by settings.json (written atomically)."""

    FILE_NAME = "settings.json"

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / self.FILE_NAME
        self._values: dict[str, Any] = {s.key: s.default for s in SETTINGS}
        if self.path.exists():
            try:
                stored = json.loads(self.path.read_text("utf-8"))
            except (OSError, ValueError) as exc:
                raise InputError(f"The settings file {self.path} is unreadable: {exc}") from None
            if not isinstance(stored, dict):
                raise InputError(f"The settings file {self.path} does not hold an object.")
            for key, value in stored.items():
                if key in BY_KEY:  # keys from a newer version are ignored, not fatal
                    self._values[key] = coerce(key, value)

    def get(self, key: str) -> Any:
        if key not in BY_KEY:
            raise InputError(f"Unknown setting '{key}'.")
        return self._values[key]

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def override(self, changes: dict[str, Any]) -> None:
        """Apply checked values for this run only (command-line --set); nothing is saved."""
        self._values.update({key: coerce(key, value) for key, value in changes.items()})

    def update(self, changes: dict[str, Any]) -> bool:
        """Apply and save changes; return True when the runtime fingerprint inputs changed."""
        converted = {key: coerce(key, value) for key, value in changes.items()}
        runtime_changed = any(
            BY_KEY[k].runtime and self._values[k] != v for k, v in converted.items()
        )
        self._values.update(converted)
        atomic_write_bytes(self.path, json.dumps(self._values, indent=2).encode("utf-8"))
        return runtime_changed
