"""Every setting as a typed field: what the code reads (`settings.values.n_ctx` is an int).

settings.py declares each setting once (key, type, default, range, description); this is
its typed view, and a test keeps the two the same field for field and type for type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

FlashAttn = Literal["auto", "on", "off"]
KvTypeName = Literal["f16", "f32", "q8_0", "q4_0"]
Preset = Literal["none", "concise", "coder", "tutor", "translator"]
ImageBudget = Literal[70, 140, 280, 560, 1120]  # Gemma 4's soft-token budgets for a picture


@dataclass(frozen=True)
class Setting:
    key: str
    type: type
    default: Any
    description: str
    runtime: bool  # True when a change alters the runtime fingerprint (stored blocks re-read)
    choices: tuple[Any, ...] | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    optional: bool = False  # None means "the model's recommendation"
    # How the Settings dialog shows it: its section, a plain name, the unit, and whether it
    # is folded under "Advanced" (most people never need it).
    group: str = "Advanced"
    label: str = ""
    unit: str = ""
    advanced: bool = False
    special: str = ""  # what the minimum means, shown in its place ("as much as fits")


@dataclass(frozen=True)
class SettingValues:
    model_path: str
    n_ctx: int
    n_gpu_layers: int
    rpc_servers: str
    n_threads: int
    n_batch: int
    n_ubatch: int
    flash_attn: FlashAttn
    kv_type: KvTypeName
    read_in_f16: bool
    swa_full: bool
    chain_blocks: bool
    compact_after: int
    checkpoints: int
    disk_budget: int | None
    part_tokens: int
    part_overlap: int
    route_min_strength: float
    route_min_margin: float
    embedding_model: str
    projector: str
    image_min_tokens: ImageBudget
    image_max_tokens: ImageBudget
    route_min_similarity: float
    route_min_coverage: float
    route_hybrid_margin: float
    route_strong_coverage: float
    rerank: bool
    rerank_candidates: int
    route_across: bool
    route_min_pmi: float
    route_pmi_margin: float
    route_pmi_alone: float
    system_prompt: Preset
    enter_sends: bool
    thinking: bool
    temperature: float | None
    top_p: float | None
    top_k: int | None
    max_tokens: int | None
    seed: int | None


# Built-in presets: product text, not user data, so they may live in plain settings.
SYSTEM_PROMPTS: dict[str, str] = {
    "none": "",
    "concise": "You are a helpful assistant. Answer briefly and precisely.",
    "coder": "You are an expert programmer. Answer with correct, idiomatic code and short "
    "explanations; use fenced code blocks.",
    "tutor": "You are a patient tutor. Explain step by step and check understanding.",
    "translator": "You translate the user's text faithfully; reply with the translation only.",
}


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
    raise ValueError(value)
