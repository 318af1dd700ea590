"""Sentence embeddings from a GGUF embedding model through llama.cpp: the router's semantic half.

A separate, small llama.cpp context (the chat model's KV cache is never touched), owned by the
same thread as the chat engine. Vectors are unit length, so a dot product is the cosine
similarity. Models that want an instruction before the text (EmbeddingGemma, E5) get it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from galahad_desktop.engine import devices
from galahad_desktop.engine.modelinfo import check_model_file
from galahad_desktop.engine.native import ContextSettings, NativeContext, NativeModel
from galahad_desktop.errors import ModelError

CONTEXT = 512  # tokens per passage: the router's passages are ~120 words


@dataclass(frozen=True)
class Prompts:
    query: str
    passage: str


# What each family expects before a query and a passage (their model cards).
_PROMPTS: tuple[tuple[str, Prompts], ...] = (
    ("gemma-embedding", Prompts("task: search result | query: ", "title: none | text: ")),
    ("embeddinggemma", Prompts("task: search result | query: ", "title: none | text: ")),
    ("e5", Prompts("query: ", "passage: ")),
)


def prompts_for(architecture: str, name: str) -> Prompts:
    key = f"{architecture} {name}".lower()
    for needle, prompts in _PROMPTS:
        if needle in key:
            return prompts
    return Prompts("", "")


class Embedder:
    def __init__(self, path: Path, n_threads: int | None = None) -> None:
        check_model_file(path)
        threads = n_threads or max(1, min(8, os.cpu_count() or 1))
        try:
            # Beside the chat model, on the CPU; a passage is encoded in one pass
            # (non-causal models), several packed into one batch as separate sequences.
            self._model: NativeModel | None = NativeModel(path, devices=devices.handles([]))
        except ValueError as exc:
            raise ModelError(f"The embedding model {path} could not be loaded: {exc}") from None
        settings = ContextSettings(
            n_ctx=CONTEXT,
            n_batch=CONTEXT,
            n_ubatch=CONTEXT,
            n_threads=threads,
            n_seq_max=min(CONTEXT, int(llama_cpp.llama_max_parallel_sequences())),
            kv_unified=True,
            embeddings=True,
        )
        try:
            self._context: NativeContext | None = NativeContext(self._model, settings)
        except ValueError as exc:
            self.close()
            raise ModelError(f"The embedding model {path} could not be loaded: {exc}") from None
        meta = self._model.metadata
        self.path = path
        self.architecture = str(meta.get("general.architecture", ""))
        self.name = str(meta.get("general.name", path.stem))
        pooling = llama_cpp.llama_pooling_type(self._context.handle)
        if pooling == llama_cpp.LLAMA_POOLING_TYPE_NONE:
            self.close()
            raise ModelError(
                f"{path.name} is not an embedding model (it gives no sentence vector); "
                "choose one such as EmbeddingGemma.",
                command="galahad models get embeddinggemma --use",
                window="Choose another under File → Settings… → Meaning model (embeddings).",
            )
        self.dimensions = self._model.facts.n_embd
        self.prompts = prompts_for(self.architecture, self.name)

    @property
    def identity(self) -> str:
        """Which vectors this model makes: stored vectors from another model (or another
        file of it) are never mixed in."""
        size = self.path.stat().st_size
        text = f"{self.architecture}|{self.name}|{self.dimensions}|{size}|{self.prompts}"
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.dimensions} dimensions)"

    def _embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        if self._model is None or self._context is None:
            raise ModelError("The embedding model is closed.")
        model = self._model
        sequences = [model.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in texts]
        vectors = np.asarray(self._context.embed(sequences, self.dimensions), dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        unit: np.ndarray = vectors / np.maximum(norms, 1e-12)
        return unit

    def passages(self, texts: list[str]) -> np.ndarray:
        return self._embed([self.prompts.passage + t for t in texts])

    def query(self, text: str) -> np.ndarray:
        vector: np.ndarray = self._embed([self.prompts.query + text])[0]
        return vector

    def close(self) -> None:
        context = getattr(self, "_context", None)
        if context is not None:
            context.close()
            self._context = None
        model = getattr(self, "_model", None)
        if model is not None:
            model.close()
            self._model = None
