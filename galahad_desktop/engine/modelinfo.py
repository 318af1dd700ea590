"""What a GGUF file is: name, architecture, quantization, template, and what kind of model it
is for a chat (instruction-tuned with a template, or a base model that only continues text)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from galahad_desktop.errors import ModelError

ModelKind = Literal["chat", "base", "demo"]

GGUF_MAGIC = b"GGUF"
DEMO_LABEL = "text-continuation demo model that does not follow instructions"
BASE_LABEL = "base model: it continues text and does not follow instructions"

# llama.cpp's LLAMA_FTYPE values for the quantizations people use with Gemma.
_FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: str
    architecture: str
    description: str
    n_params: int
    size_bytes: int
    n_ctx_train: int
    n_layers: int
    has_chat_template: bool
    quantization: str
    kind: ModelKind
    label: str  # what the user is told about the model
    window: int = 0  # the sliding-window layers' span in tokens (0: none)


def check_model_file(path: Path) -> None:
    try:
        if not path.exists():
            raise ModelError(f"The model file {path} does not exist.")
        if not path.is_file():
            raise ModelError(f"{path} is not a regular file, so it is not a model file.")
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelError(f"The model file {path} cannot be read: {exc.strerror}.") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF model file.")


def quantization_name(meta: dict[str, Any]) -> str:
    raw = meta.get("general.file_type")
    try:
        return _FILE_TYPES.get(int(raw), f"type {raw}") if raw is not None else "unknown"
    except ValueError:
        return str(raw)


def model_kind(has_template: bool, embedded: bool) -> tuple[ModelKind, str]:
    if embedded:
        return "demo", DEMO_LABEL
    if not has_template:
        return "base", BASE_LABEL
    return "chat", "instruction-tuned chat model"
