"""A small random-weight Gemma 4 GGUF for tests, written offline with the `gguf` writer.

No Gemma 4 file can be downloaded on the build machines, so the test suite builds one with
the architecture's real features: interleaved sliding-window and global layers with
different head sizes and KV-head counts, a window shorter than the test conversations,
KV-shared final layers, per-layer embeddings, the BPE tokenizer (`tokenizer.ggml.model =
"gemma4"`) with the markup tokens at their real ids and types, and the real chat template.

The vocabulary is the embedded Gemma 3 model's 262,144 pieces (the same SentencePiece
family), with BPE merges derived from their ranks; the template is read from the pinned
llama-cpp-python source package (never committed here) and checked against its SHA-256.
The weights are random: the model produces nonsense, but every mechanism (tokenizer,
template, KV layout, state save and restore) is the real one. Built files are cached by a
hash of everything that goes into them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import gguf  # imported where a file is written: it is only needed then

TEMPLATE_MEMBER = "vendor/llama.cpp/models/templates/google-gemma-4-31B-it.jinja"
TEMPLATE_SHA256 = "85a08664d16d8f3be4416c92427b3ac10df1024ac566cc0b4bc3bab409393f98"
LLAMA_CPP_PYTHON = "0.3.36"
# 2: the picture markers <|image> and <image|>; 3: every media marker at Gemma 4's real id
BUILDER_VERSION = 3

# Gemma 4's markup tokens at their real ids. Control tokens are never matched in raw text;
# the converter stores the seven channel/tool markers as user-defined, which llama.cpp
# matches inside raw text even with parse_special=False.
CONTROL, USER_DEFINED = 3, 4
MARKUP: dict[int, tuple[str, int]] = {
    46: ("<|tool>", CONTROL),
    47: ("<tool|>", CONTROL),
    48: ("<|tool_call>", USER_DEFINED),
    49: ("<tool_call|>", USER_DEFINED),
    50: ("<|tool_response>", USER_DEFINED),
    51: ("<tool_response|>", USER_DEFINED),
    52: ('<|"|>', USER_DEFINED),
    98: ("<|think|>", CONTROL),
    100: ("<|channel>", USER_DEFINED),
    101: ("<channel|>", USER_DEFINED),
    105: ("<|turn>", CONTROL),
    106: ("<turn|>", CONTROL),
    # Around a picture's or a sound's embeddings (llama.cpp's mtmd writes them as text and
    # parses them as tokens), and the placeholders Gemma 4's processor uses, at the ids its
    # config names (boi 255999, boa 256000, image 258880, audio 258881, eoi 258882, eoa
    # 258883; video 258884).
    255999: ("<|image>", CONTROL),
    256000: ("<|audio>", CONTROL),
    258880: ("<|image|>", CONTROL),
    258881: ("<|audio|>", CONTROL),
    258882: ("<image|>", CONTROL),
    258883: ("<audio|>", CONTROL),
    258884: ("<|video|>", CONTROL),
}


@dataclass(frozen=True)
class Gemma4Shape:
    """Layer 3 is the last that owns KV (global) and layer 2 before it is sliding, as
    llama.cpp requires when the last layers share KV; layers 4 and 5 reuse them."""

    n_embd: int = 128
    n_ff: int = 256
    n_head: int = 4
    head_swa: int = 32
    head_global: int = 64
    kv_heads: tuple[int, ...] = (2, 1, 2, 2, 2, 2)
    swa_pattern: tuple[bool, ...] = (True, True, True, False, True, False)
    shared_kv_layers: int = 2
    window: int = 128
    per_layer_embd: int = 16
    context: int = 32768
    seed: int = 4

    @property
    def n_layer(self) -> int:
        return len(self.swa_pattern)


def cache_dir() -> Path:
    override = os.environ.get("GALAHAD_TEST_MODEL_CACHE")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("galahad-desktop-test", appauthor=False))


def chat_template(cache: Path) -> str:
    """The real Gemma 4 template from the pinned llama-cpp-python sdist (cached)."""
    cached = cache / "google-gemma-4-31B-it.jinja"
    if cached.exists() and hashlib.sha256(cached.read_bytes()).hexdigest() == TEMPLATE_SHA256:
        return cached.read_text("utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                tmp,
                f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
            ],
            check=True,
        )
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(archive) as tar:
            member = tar.getmember(f"llama_cpp_python-{LLAMA_CPP_PYTHON}/{TEMPLATE_MEMBER}")
            handle = tar.extractfile(member)
            assert handle is not None
            raw = handle.read()
    if hashlib.sha256(raw).hexdigest() != TEMPLATE_SHA256:
        raise RuntimeError("the Gemma 4 chat template in the sdist is not the pinned one")
    cache.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(raw)
    return raw.decode("utf-8")


@dataclass
class Vocabulary:
    tokens: list[str]
    types: list[int]
    scores: list[float]


def gemma3_vocabulary(model_path: Path) -> Vocabulary:
    """Pieces, types and scores of the embedded Gemma 3 model (vocabulary only)."""
    import llama_cpp

    from galahad_desktop.engine import gguf

    model = gguf.vocabulary(model_path)
    try:
        vocab = model.vocab
        n = int(llama_cpp.llama_vocab_n_tokens(vocab))
        tokens, types, scores = [], [], []
        for i in range(n):
            tokens.append(llama_cpp.llama_vocab_get_text(vocab, i).decode("utf-8", "replace"))
            attr = int(llama_cpp.llama_vocab_get_attr(vocab, i))
            types.append(_type_of(attr))
            scores.append(float(llama_cpp.llama_vocab_get_score(vocab, i)))
    finally:
        model.close()
    return Vocabulary(tokens, types, scores)


def _type_of(attr: int) -> int:
    import llama_cpp

    if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
        return CONTROL
    if attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED:
        return USER_DEFINED
    if attr & llama_cpp.LLAMA_TOKEN_ATTR_BYTE:
        return 6
    if attr & llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN:
        return 2
    if attr & llama_cpp.LLAMA_TOKEN_ATTR_UNUSED:
        return 5
    return 1


def derive_merges(vocab: Vocabulary) -> list[str]:
    """BPE merges from SentencePiece ranks: each normal piece of two or more characters is
    built from the split whose halves are both pieces and were themselves formed earliest.
    Merges are ranked by the piece's SentencePiece score (more frequent first)."""
    normal = {
        t: i for i, (t, kind) in enumerate(zip(vocab.tokens, vocab.types, strict=True)) if kind == 1
    }
    order = sorted(normal.items(), key=lambda item: -vocab.scores[item[1]])
    rank = {token: r for r, (token, _i) in enumerate(order)}
    merges: list[str] = []
    for token, _i in order:
        if len(token) < 2 or " " in token or "\n" in token:
            continue
        best: tuple[int, str, str] | None = None
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in normal and right in normal:
                cost = max(
                    rank[left] if len(left) > 1 else -1, rank[right] if len(right) > 1 else -1
                )
                if best is None or cost < best[0]:
                    best = (cost, left, right)
        if best is not None:
            merges.append(f"{best[1]} {best[2]}")
    return merges


def _fingerprint(shape: Gemma4Shape, gemma3_sha: str) -> str:
    source = Path(__file__).read_bytes()
    payload = (
        json.dumps(
            {
                "shape": asdict(shape),
                "gemma3": gemma3_sha,
                "template": TEMPLATE_SHA256,
                "builder": BUILDER_VERSION,
            },
            sort_keys=True,
        ).encode()
        + source
    )
    return hashlib.sha256(payload).hexdigest()[:16]


def _gemma3_sha(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.name}|{stat.st_size}".encode()).hexdigest()


def build(gemma3_path: Path, out_dir: Path | None = None, shape: Gemma4Shape | None = None) -> Path:
    """The Gemma 4 test model's path, built (seconds) unless a cached copy exists."""
    shape = shape or Gemma4Shape()
    cache = cache_dir()
    out_dir = out_dir or cache
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"gemma4-test-{_fingerprint(shape, _gemma3_sha(gemma3_path))}.gguf"
    if target.exists():
        return target
    template = chat_template(cache)
    vocab, merges = _gemma4_vocabulary(gemma3_path)
    return write_once(target, lambda tmp: _write(tmp, shape, vocab, merges, template))


@functools.lru_cache(maxsize=1)
def _gemma4_vocabulary(gemma3_path: Path) -> tuple[Vocabulary, list[str]]:
    """The vocabulary with Gemma 4's markup and its merges, once per process (several
    shapes are built from one)."""
    vocab = gemma3_vocabulary(gemma3_path)
    for token_id, (text, kind) in MARKUP.items():
        vocab.tokens[token_id], vocab.types[token_id], vocab.scores[token_id] = text, kind, 0.0
    return vocab, derive_merges(vocab)


def write_once(target: Path, write: Callable[[Path], None]) -> Path:
    """Write a built file under a temporary name and move it into place (a build that
    stops half way never leaves a file the cache would take for a whole one)."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return target


def _write(
    path: Path, shape: Gemma4Shape, vocab: Vocabulary, merges: list[str], template: str
) -> None:
    import gguf

    arch = "gemma4"
    writer = gguf.GGUFWriter(str(path), arch)
    s = shape
    writer.add_name("Galahad Gemma 4 test model (random weights)")
    # The architecture's numbers, in the order llama.cpp's converter writes them (ints as
    # uint32, floats as float32, lists as arrays).
    numbers: dict[str, int | float | list[int] | list[bool]] = {
        "context_length": s.context, "embedding_length": s.n_embd, "block_count": s.n_layer,
        "feed_forward_length": s.n_ff, "attention.head_count": s.n_head,
        "attention.head_count_kv": list(s.kv_heads),
        "attention.key_length": s.head_global, "attention.value_length": s.head_global,
        "attention.key_length_swa": s.head_swa, "attention.value_length_swa": s.head_swa,
        "attention.layer_norm_rms_epsilon": 1e-6, "attention.sliding_window": s.window,
        "attention.sliding_window_pattern": list(s.swa_pattern),
        "attention.shared_kv_layers": s.shared_kv_layers,
        "embedding_length_per_layer_input": s.per_layer_embd,
        "rope.dimension_count": s.head_global, "rope.dimension_count_swa": s.head_swa,
        "rope.freq_base": 1_000_000.0, "rope.freq_base_swa": 10_000.0,
        "final_logit_softcapping": 30.0,
    }  # fmt: skip
    for key, value in numbers.items():
        if isinstance(value, list):
            writer.add_array(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    # The publisher's recommended sampling, as Google's Gemma 4 GGUFs carry it.
    writer.add_float32("general.sampling.temp", 1.0)
    writer.add_int32("general.sampling.top_k", 64)
    writer.add_float32("general.sampling.top_p", 0.95)

    writer.add_string("tokenizer.ggml.model", "gemma4")
    writer.add_string("tokenizer.ggml.pre", "gemma4")
    writer.add_array("tokenizer.ggml.tokens", vocab.tokens)
    writer.add_array("tokenizer.ggml.token_type", vocab.types)
    writer.add_array("tokenizer.ggml.scores", vocab.scores)
    writer.add_array("tokenizer.ggml.merges", merges)
    writer.add_uint32("tokenizer.ggml.bos_token_id", 2)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 1)
    writer.add_uint32("tokenizer.ggml.unknown_token_id", 3)
    writer.add_uint32("tokenizer.ggml.padding_token_id", 0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_bool("tokenizer.ggml.add_eos_token", False)
    writer.add_string("tokenizer.chat_template", template)

    rng = np.random.default_rng(s.seed)
    n_vocab = len(vocab.tokens)

    def weights(*dims: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * scale).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def q8(array: np.ndarray) -> np.ndarray:
        return gguf.quants.quantize(array.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)

    Q8 = gguf.GGMLQuantizationType.Q8_0
    embd = q8(weights(n_vocab, s.n_embd, scale=0.5))
    writer.add_tensor("token_embd.weight", embd, raw_dtype=Q8)
    per_layer = s.per_layer_embd * s.n_layer
    if per_layer:  # 0: no per-layer embeddings (26B-A4B, 31B)
        writer.add_tensor(
            "per_layer_token_embd.weight",
            q8(weights(n_vocab, per_layer, scale=0.5)),
            raw_dtype=Q8,
        )
        writer.add_tensor("per_layer_model_proj.weight", weights(per_layer, s.n_embd))
        writer.add_tensor("per_layer_proj_norm.weight", ones(s.per_layer_embd))
    writer.add_tensor("output_norm.weight", ones(s.n_embd))
    writer.add_tensor("rope_freqs.weight", ones(s.head_global // 2))
    owners = s.n_layer - s.shared_kv_layers
    for il, sliding in enumerate(s.swa_pattern):
        head = s.head_swa if sliding else s.head_global
        p = f"blk.{il}."
        writer.add_tensor(p + "attn_norm.weight", ones(s.n_embd))
        writer.add_tensor(p + "attn_q.weight", weights(s.n_head * head, s.n_embd))
        writer.add_tensor(p + "attn_q_norm.weight", ones(head))
        if il < owners:
            writer.add_tensor(p + "attn_k.weight", weights(s.kv_heads[il] * head, s.n_embd))
            writer.add_tensor(p + "attn_v.weight", weights(s.kv_heads[il] * head, s.n_embd))
            writer.add_tensor(p + "attn_k_norm.weight", ones(head))
        writer.add_tensor(p + "attn_output.weight", weights(s.n_embd, s.n_head * head))
        writer.add_tensor(p + "post_attention_norm.weight", ones(s.n_embd))
        writer.add_tensor(p + "ffn_norm.weight", ones(s.n_embd))
        writer.add_tensor(p + "ffn_gate.weight", weights(s.n_ff, s.n_embd))
        writer.add_tensor(p + "ffn_up.weight", weights(s.n_ff, s.n_embd))
        writer.add_tensor(p + "ffn_down.weight", weights(s.n_embd, s.n_ff))
        writer.add_tensor(p + "post_ffw_norm.weight", ones(s.n_embd))
        if per_layer:
            writer.add_tensor(p + "inp_gate.weight", weights(s.per_layer_embd, s.n_embd))
            writer.add_tensor(p + "proj.weight", weights(s.n_embd, s.per_layer_embd))
            writer.add_tensor(p + "post_norm.weight", ones(s.n_embd))
    write_out(writer)


def write_out(writer: gguf.GGUFWriter) -> None:
    """Header, metadata and tensors, in the order a GGUF file holds them."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> int:
    from galahad_desktop.paths import default_model_path

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    print(build(default_model_path(), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
