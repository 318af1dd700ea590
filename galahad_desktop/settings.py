"""Every setting declared once: key, type, default, range, description (and whether it changes
the bits of a KV state).

Settings live in `settings.json` in the data directory. They hold no private data (the
system prompt, which might, is not a setting here: only the name of a built-in preset).
A value is checked against its type and finite range wherever it comes from: `--set`,
`galahad settings KEY=VALUE`, the Settings dialog, and the file itself. A bad value in the
file is reported and ignored (the default is used), never fatal.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from galahad_desktop.errors import InputError
from galahad_desktop.setting_values import SYSTEM_PROMPTS as SYSTEM_PROMPTS  # its home before
from galahad_desktop.setting_values import Setting as Setting  # declared beside its values
from galahad_desktop.setting_values import SettingValues, parse_bool
from galahad_desktop.sizes import parse_size, within_the_disk
from galahad_desktop.system.files import atomic_write_bytes, read_regular_file

log = logging.getLogger(__name__)
AUTO = ("", "auto", "model", "none", "null")  # spellings of "use the model's recommendation"


# The Settings dialog's sections, in order.
IMAGE_BUDGETS = (70, 140, 280, 560, 1120)  # Gemma 4's soft-token budgets for a picture
GROUPS = ("Model", "Performance", "Memory and documents", "Answers", "Privacy")


# The model-checked gate's defaults, calibrated by `python -m galahad_dev eval routing` on
# the calibration half of its questions (docs/evaluations.md).
RERANK_MIN_PMI = 6.0
RERANK_MARGIN = 30.0
RERANK_ALONE = 30.0


def _default_threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "model_path",
        str,
        "",
        "GGUF model file; empty means the embedded Gemma 3 270M demo model.",
        runtime=True,
        group="Model",
        label="Model file",
    ),
    Setting(
        "n_ctx",
        int,
        8192,
        "How much text the model can hold at once (a conversation, or a document and its "
        "questions); more needs more memory.",
        runtime=True,
        minimum=512,
        maximum=262_144,
        group="Model",
        label="Context length",
        unit="tokens",
    ),
    Setting(
        "n_gpu_layers",
        int,
        -1,
        "How much of the model runs on the graphics card: -1 as much as fits in its free "
        "memory, 0 none (the CPU alone).",
        runtime=True,
        minimum=-1,
        maximum=1024,
        group="Performance",
        label="GPU offload",
        unit="layers",
        special="all that fits (none without a graphics card)",
    ),
    Setting(
        "rpc_servers",
        str,
        "",
        "Another device's graphics card, reached through the device server run there "
        "(HOST:PORT, comma-separated, e.g. 127.0.0.1:50052); used like a GPU. Empty: none.",
        runtime=True,
        group="Performance",
        label="Remote graphics cards",
        advanced=True,
    ),
    Setting(
        "n_threads",
        int,
        _default_threads(),
        "Processor threads the model uses.",
        runtime=True,
        minimum=1,
        maximum=max(1, (os.cpu_count() or 1) * 2),
        group="Performance",
        label="CPU threads",
        unit="threads",
    ),
    Setting(
        "n_batch",
        int,
        512,
        "Tokens read at once from a message or document: more is faster on a GPU, takes memory.",
        runtime=True,
        minimum=32,
        maximum=8192,
        group="Performance",
        label="Tokens read at once",
        unit="tokens",
        advanced=True,
    ),
    Setting(
        "n_ubatch",
        int,
        512,
        "Of those, tokens computed in one step: more is faster on a GPU and uses more memory.",
        runtime=True,
        minimum=32,
        maximum=8192,
        group="Performance",
        label="Tokens computed per step",
        unit="tokens",
        advanced=True,
    ),
    Setting(
        "flash_attn",
        str,
        "auto",
        "Flash attention: auto (on: measured faster on CPU here, and llama.cpp's own default on "
        "a GPU), on or off.",
        runtime=True,
        choices=("auto", "on", "off"),
        group="Performance",
        label="Flash attention",
        advanced=True,
    ),
    Setting(
        "kv_type",
        str,
        "f16",
        "How precisely the model's memory of what it read is kept: q8_0 takes about half "
        "the disk per word, q4_0 about a quarter (both need flash attention; q4_0 reads "
        "more slowly and changes answers noticeably); f16 keeps it as the model computed it.",
        runtime=True,
        choices=("f16", "f32", "q8_0", "q4_0"),
        group="Memory and documents",
        label="Memory precision",
    ),
    Setting(
        "read_in_f16",
        bool,
        True,
        "With compact (q8_0) memory, read long texts at full precision and make them compact "
        "after: about twice as fast to read, the same memory kept on disk.",
        runtime=True,
        group="Memory and documents",
        label="Read at full precision, keep compact",
        advanced=True,
    ),
    Setting(
        "swa_full",
        bool,
        False,
        "Keep everything for the layers that look only at recent words (more memory); off "
        "keeps just their recent words, which reads faster and restores just as exactly.",
        runtime=True,
        group="Performance",
        label="Keep all of the recent-word layers",
        advanced=True,
    ),
    Setting(
        "chain_blocks",
        bool,
        True,
        "Each turn stores only what it added (small, quick writes); off stores the whole "
        "conversation's memory again every turn (slower, more disk).",
        runtime=False,
        group="Memory and documents",
        label="Store only what each turn adds",
        advanced=True,
    ),
    Setting(
        "compact_after",
        int,
        24,
        "Merge a conversation's stored turns into one (in the background) once it has more "
        "than this; the newest turns kept apart (below) stay separate.",
        runtime=False,
        minimum=4,
        maximum=10_000,
        group="Memory and documents",
        label="Merge stored turns after",
        unit="turns",
        advanced=True,
    ),
    Setting(
        "checkpoints",
        int,
        8,
        "Turns kept apart when stored turns are merged, together at most 1 GB (a 16th of a "
        "set disk budget): regenerate and edit restore them; an older turn is read again.",
        runtime=False,
        minimum=2,
        maximum=10_000,
        group="Memory and documents",
        label="Turns kept apart when merging",
        unit="turns",
        advanced=True,
    ),
    Setting(
        "disk_budget",
        int,
        None,
        "The most disk space kept memory may take (e.g. 20GB); when a save would go past "
        "it, what was used longest ago gives its memory back and is re-read once when next "
        "opened (its messages stay). Empty: a quarter of the disk, at most half its free "
        "space; 0: no limit.",
        runtime=False,
        minimum=0,
        maximum=2**62,
        optional=True,
        group="Memory and documents",
        label="Disk space for memory",
        unit="bytes",
    ),
    Setting(
        "part_tokens",
        int,
        0,
        "Tokens per part of a long document; 0 fits each part in the context with room "
        "for a question and its answer.",
        runtime=False,
        minimum=0,
        maximum=262_144,
        group="Memory and documents",
        label="Document part size",
        unit="tokens",
    ),
    Setting(
        "part_overlap",
        int,
        64,
        "Tokens of the previous part repeated at the start of the next one.",
        runtime=False,
        minimum=0,
        maximum=4096,
        group="Memory and documents",
        label="Part overlap",
        unit="tokens",
        advanced=True,
    ),
    Setting(
        "route_min_strength",
        float,
        0.5,
        "Router: the least share of the question (its words and word pairs, weighted by "
        "rarity) the best part must hold to answer without asking.",
        runtime=False,
        minimum=0.0,
        maximum=1.0,
        group="Memory and documents",
        label="Least word match to answer",
        unit="share",
        advanced=True,
    ),
    Setting(
        "route_min_margin",
        float,
        1.5,
        "Router: how many times the runner-up's share the best part must hold.",
        runtime=False,
        minimum=1.0,
        maximum=100.0,
        group="Memory and documents",
        label="Word match lead over the runner-up",
        unit="×",
        advanced=True,
    ),
    Setting(
        "embedding_model",
        str,
        "",
        "GGUF embedding model (e.g. EmbeddingGemma: galahad models get embeddinggemma) that "
        "adds meaning to the router's word matching; empty routes by words alone.",
        runtime=False,
        group="Memory and documents",
        label="Meaning model (embeddings)",
    ),
    Setting(
        "projector",
        str,
        "",
        "The model's projector (mmproj GGUF): it reads pictures and scans, and hears voice "
        "memos on Gemma 4 E2B/E4B; empty: an mmproj file next to the model, if any.",
        runtime=False,  # it changes only blocks holding pictures (their own fingerprint)
        group="Model",
        label="Vision projector",
        advanced=True,
    ),
    Setting(
        "image_min_tokens",
        int,
        70,
        "The fewest tokens a picture is read as: one of Gemma 4's five budgets (70, 140, 280, "
        "560 or 1,120).",
        runtime=False,
        choices=IMAGE_BUDGETS,
        group="Memory and documents",
        label="Least tokens per picture",
        unit="tokens",
        advanced=True,
    ),
    Setting(
        "image_max_tokens",
        int,
        280,
        "The most tokens a picture is read as: more sees finer detail, costs more to read "
        "and store (one of Gemma 4's five budgets; 280 by default).",
        runtime=False,
        choices=IMAGE_BUDGETS,
        group="Memory and documents",
        label="Most tokens per picture",
        unit="tokens",
        advanced=True,
    ),
    Setting(
        "route_min_similarity",
        float,
        0.4,
        "Router with an embedding model: the least cosine similarity between the question "
        "and the best passage to answer without asking.",
        runtime=False,
        minimum=0.0,
        maximum=1.0,
        group="Memory and documents",
        label="Least meaning match to answer",
        unit="cosine",
        advanced=True,
    ),
    Setting(
        "route_min_coverage",
        float,
        0.2,
        "Router with an embedding model: the least share of the question's words (weighted "
        "by rarity) the best passage must hold.",
        runtime=False,
        minimum=0.0,
        maximum=1.0,
        group="Memory and documents",
        label="Least word share with meaning",
        unit="share",
        advanced=True,
    ),
    Setting(
        "route_hybrid_margin",
        float,
        1.2,
        "Router with an embedding model: how many times the best part's fused score must be "
        "that of the best part of any other document.",
        runtime=False,
        minimum=1.0,
        maximum=100.0,
        group="Memory and documents",
        label="Lead over another document",
        unit="×",
        advanced=True,
    ),
    Setting(
        "route_strong_coverage",
        float,
        0.9,
        "Router with an embedding model: a passage holding this share of the question's "
        "words (a name, a code) answers on words alone, however far the meaning.",
        runtime=False,
        minimum=0.0,
        maximum=1.01,
        group="Memory and documents",
        label="Word share that answers alone",
        unit="share",
        advanced=True,
    ),
    Setting(
        "rerank",
        bool,
        True,
        "Router: the chat model checks the best candidate parts itself, by how much more "
        "likely each makes the question (their stored blocks grafted, the question read once "
        "on each: a fraction of a second) and answers from the best.",
        runtime=False,
        group="Memory and documents",
        label="Let the model check candidates",
    ),
    Setting(
        "rerank_candidates",
        int,
        5,
        "Router: how many candidate parts the chat model checks.",
        runtime=False,
        minimum=1,
        maximum=20,
        group="Memory and documents",
        label="Candidates the model checks",
        unit="parts",
        advanced=True,
    ),
    Setting(
        "route_across",
        bool,
        True,
        "Router: a question whose words are in several parts (two documents, say) is "
        "answered from the best two or three read together, each cited; off, from one part.",
        runtime=False,
        group="Memory and documents",
        label="Answer from several parts",
    ),
    Setting(
        "route_min_pmi",
        float,
        RERANK_MIN_PMI,
        "Router, checked by the model: how many nats (natural-log units) more likely the best "
        "part must make the question than no part does, to answer without asking (-100: "
        "always answer from the model's best part).",
        runtime=False,
        minimum=-100.0,
        maximum=100.0,
        group="Memory and documents",
        label="Least model evidence to answer",
        unit="nats",
        advanced=True,
    ),
    Setting(
        "route_pmi_margin",
        float,
        RERANK_MARGIN,
        "Router, checked by the model: how many nats the best part must lead the best part of "
        "any other document by (asking one document: its next part).",
        runtime=False,
        minimum=0.0,
        maximum=100.0,
        group="Memory and documents",
        label="Model evidence lead over another document",
        unit="nats",
        advanced=True,
    ),
    Setting(
        "route_pmi_alone",
        float,
        RERANK_ALONE,
        "Router, checked by the model: how many nats the model's best part needs when the "
        "word (and meaning) match ranked another part first (100: never overrule them).",
        runtime=False,
        minimum=-100.0,
        maximum=100.0,
        group="Memory and documents",
        label="Model evidence to overrule the words",
        unit="nats",
        advanced=True,
    ),
    Setting(
        "system_prompt",
        str,
        "none",
        "System prompt preset for new conversations (the model's system turn, or folded "
        "into the first turn when the model has none).",
        runtime=False,
        choices=("none", "concise", "coder", "tutor", "translator"),
        group="Answers",
        label="Assistant style",
    ),
    Setting(
        "enter_sends",
        bool,
        True,
        "In the message box, Enter sends and Shift+Enter starts a new line; off swaps them "
        "(Ctrl+Enter always sends).",
        runtime=False,
        group="Answers",
        label="Enter sends the message",
    ),
    Setting(
        "thinking",
        bool,
        False,
        "Let the model think before it answers (Gemma 4) in new conversations; the thoughts "
        "are shown, never kept in the conversation.",
        runtime=False,
        group="Answers",
        label="Think before answering",
    ),
    Setting(
        "temperature",
        float,
        None,
        "How adventurous replies are: 0 always picks the likeliest word; empty uses the "
        "model publisher's recommendation.",
        runtime=False,
        minimum=0.0,
        maximum=5.0,
        optional=True,
        group="Answers",
        label="Creativity (temperature)",
    ),
    Setting(
        "top_p",
        float,
        None,
        "Nucleus sampling mass; empty uses the model publisher's recommendation.",
        runtime=False,
        minimum=0.0,
        maximum=1.0,
        optional=True,
        group="Answers",
        label="Top P",
        unit="share",
        advanced=True,
    ),
    Setting(
        "top_k",
        int,
        None,
        "Sample among the k most likely tokens (0 disables); empty uses the model "
        "publisher's recommendation.",
        runtime=False,
        minimum=0,
        maximum=262_144,
        optional=True,
        group="Answers",
        label="Top K",
        unit="tokens",
        advanced=True,
    ),
    Setting(
        "max_tokens",
        int,
        None,
        "The longest a reply may be (thoughts included); empty uses the model's: 256 tokens "
        "under a billion parameters (small models wander on), else 1,024.",
        runtime=False,
        minimum=1,
        maximum=131_072,
        optional=True,
        group="Answers",
        label="Longest reply",
        unit="tokens",
    ),
    Setting(
        "seed",
        int,
        None,
        "Random seed for sampling; empty picks a new one for every reply, so Regenerate "
        "gives another answer (each reply keeps the seed it was made with).",
        runtime=False,
        minimum=0,
        maximum=2**32 - 1,
        optional=True,
        group="Answers",
        label="Random seed",
        advanced=True,
    ),
)

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}

# Renamed settings (old key: new key): a saved old key is taken up, never dropped silently.
RENAMED: dict[str, str] = {}


def coerce(key: str, value: Any) -> Any:
    """Check and convert one value; raise InputError naming the key when it does not fit."""
    setting = BY_KEY.get(key)
    if setting is None:
        raise InputError(f"Unknown setting '{key}'. Known settings: {', '.join(BY_KEY)}.")
    if setting.optional and (
        value is None or (isinstance(value, str) and value.strip().lower() in AUTO)
    ):
        return None
    try:
        converted: Any
        if setting.type is bool:
            converted = parse_bool(value)
        elif setting.type is int:
            if isinstance(value, bool):
                raise ValueError(value)
            if setting.unit == "bytes" and isinstance(value, str):
                value = parse_size(value, f"Setting '{key}'")
            number = float(value) if isinstance(value, str) and "." in value else value
            if isinstance(number, float) and not number.is_integer():
                raise ValueError(value)
            converted = int(number)
        elif setting.type is float:
            if isinstance(value, bool):
                raise ValueError(value)
            converted = float(value)
            if not math.isfinite(converted):
                raise InputError(f"Setting '{key}' must be a finite number, got {value!r}.")
        else:
            if isinstance(value, bool) and setting.choices == ("auto", "on", "off"):
                value = "on" if value else "off"  # a switch given as true/false
            if not isinstance(value, str):
                raise ValueError(value)
            converted = value.strip().lower() if setting.choices else value
    except (TypeError, ValueError, OverflowError):
        raise InputError(
            f"Setting '{key}' must be of type {setting.type.__name__}, got {value!r}."
        ) from None
    if setting.choices is not None and converted not in setting.choices:
        raise InputError(f"Setting '{key}' must be one of {', '.join(map(str, setting.choices))}.")
    if setting.minimum is not None and converted < setting.minimum:
        raise InputError(f"Setting '{key}' must be at least {setting.minimum}, got {converted}.")
    if setting.maximum is not None and converted > setting.maximum:
        raise InputError(f"Setting '{key}' must be at most {setting.maximum}, got {converted}.")
    if key == "model_path" and len(converted) > 4096:
        raise InputError("Setting 'model_path' is too long to be a path.")
    return converted


class Settings:
    """The settings of one data directory, backed by settings.json (written atomically)."""

    FILE_NAME = "settings.json"

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / self.FILE_NAME
        self._values: dict[str, Any] = {s.key: s.default for s in SETTINGS}
        self.problems: list[str] = []  # saved values that were ignored, and why
        if os.path.lexists(self.path):
            self._load()

    def _load(self) -> None:
        try:
            # Bounded, from a regular file only: a FIFO there never blocks the app's start,
            # a link to /dev/zero is refused before anything is read.
            raw = read_regular_file(self.path, 1_000_000, "the settings file")
            stored = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError, RecursionError, InputError) as exc:
            self.problems.append(
                f"The settings file {self.path} is unreadable ({type(exc).__name__}); the "
                "defaults are used until settings are saved again."
            )
            log.warning("settings file unreadable: %s", type(exc).__name__)
            return
        if not isinstance(stored, dict):
            self.problems.append(f"The settings file {self.path} does not hold an object.")
            return
        for old, new in RENAMED.items():
            if old in stored and new not in stored:
                stored[new] = stored[old]
        for key, value in stored.items():
            if key not in BY_KEY:  # keys from a newer version are ignored, not fatal
                continue
            try:
                self._values[key] = coerce(key, value)
            except InputError as exc:
                self.problems.append(f"Ignored the saved {key}: {exc}")

    def get(self, key: str) -> Any:
        """A setting by its key, untyped (for code that lists them); all else reads `values`."""
        if key not in BY_KEY:
            raise InputError(f"Unknown setting '{key}'.")
        return self._values[key]

    @property
    def values(self) -> SettingValues:
        """Every setting, typed."""
        return SettingValues(**self._values)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def override(self, changes: dict[str, Any]) -> None:
        """Apply checked values for this run only (command-line --set); nothing is saved."""
        self._values.update({key: coerce(key, value) for key, value in changes.items()})

    def update(self, changes: dict[str, Any]) -> bool:
        """Apply and save changes; return True when the runtime fingerprint inputs changed."""
        converted = {key: coerce(key, value) for key, value in changes.items()}
        within_the_disk(converted.get("disk_budget"), self.path.parent, "Setting 'disk_budget'")
        runtime = any(BY_KEY[k].runtime and self._values[k] != v for k, v in converted.items())
        self._values.update(converted)
        atomic_write_bytes(self.path, json.dumps(self._values, indent=2).encode("utf-8"))
        return runtime
