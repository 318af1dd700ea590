"""A small random-weight Gemma 4 vision projector (`mmproj`) for tests, written offline.

llama.cpp reads a Gemma 4 picture through a projector file next to the model: a vision
transformer (`gemma4v`) whose patches are pooled 3×3 into image tokens and projected into the
text model's embedding space. No real projector can be downloaded on the build machines, so
the suite writes one with the real layout llama.cpp's loader expects (`clip.vision.*` keys,
the `v.blk.N.*` tensors with Gemma 4's query/key norms and post-norms, the x/y position
tables, the standardisation vectors and `mm.input_projection`), small and with random
weights: its image tokens mean nothing, but every mechanism (preprocessing within the
70–1,120 token budget, encoding, evaluating embeddings at their positions, the state they
leave) is the real one. Built files are cached by a hash of everything that goes into them.

With `audio`, the file also carries an audio encoder, as the E2B and E4B projectors do: the
real `gemma4a` layout (`clip.audio.*` keys; two stride-2 convolutions over 128 mel bins with
their norms, `a.input_projection`, conformer blocks with half-step feed-forwards, chunked
attention with per-dimension scales and relative positions, the light convolution module,
then `a.pre_encode.out`, `mm.a.soft_emb_norm` and `mm.a.input_projection` into the text
model), small and random: llama.cpp's own mel front end, encoder, chunking (30 s) and
embedding decode run for real on it, 25 audio tokens a second.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from galahad_dev.gemma4_model import Gemma4Shape, cache_dir, write_once, write_out

if TYPE_CHECKING:
    import gguf

BUILDER_VERSION = 1


@dataclass(frozen=True)
class ProjectorShape:
    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 128
    n_layer: int = 2
    patch_size: int = 16
    pool: int = 3  # patches pooled per side into one image token (Gemma 4's kernel)
    position_table: int = 1024  # patches per side the position tables cover
    seed: int = 7


@dataclass(frozen=True)
class AudioShape:
    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 128
    n_layer: int = 2
    n_mel: int = 128  # Gemma 4's mel bins
    channels: tuple[int, int] = (8, 4)  # the two subsampling convolutions' (128, 32 real)
    out_dim: int = 96  # a.pre_encode.out's width (1,536 real)
    seed: int = 11


def _fingerprint(shape: ProjectorShape, text_embd: int, audio: AudioShape | None) -> str:
    made: dict[str, object] = {
        "shape": asdict(shape),
        "text_embd": text_embd,
        "builder": BUILDER_VERSION,
    }
    if audio is not None:
        made["audio"] = asdict(audio)
    payload = json.dumps(made, sort_keys=True).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def build(
    text_shape: Gemma4Shape | None = None,
    out_dir: Path | None = None,
    shape: ProjectorShape | None = None,
    audio: AudioShape | None = None,
) -> Path:
    """The test projector's path (for the Gemma 4 test model), built unless cached; with
    `audio`, one that also hears (as E2B's and E4B's do)."""
    shape = shape or ProjectorShape()
    text_embd = (text_shape or Gemma4Shape()).n_embd
    out_dir = out_dir or cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    kind = "gemma4-test-audio" if audio is not None else "gemma4-test"
    target = out_dir / f"mmproj-{kind}-{_fingerprint(shape, text_embd, audio)}.gguf"
    if target.exists():
        return target
    return write_once(target, lambda tmp: _write(tmp, shape, text_embd, audio))


def _random_f16(rng: np.random.Generator) -> Callable[..., np.ndarray]:
    """Random f16 weights of the given dims, drawn from `rng` (scale 0.05 unless told)."""

    def weights(*dims: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * scale).astype(np.float16)

    return weights


def ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


def _write(path: Path, s: ProjectorShape, text_embd: int, audio: AudioShape | None) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_name("Galahad Gemma 4 test projector (random weights)")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_vision_projector_type(gguf.VisionProjectorType.GEMMA4V)
    writer.add_vision_projection_dim(text_embd)
    writer.add_vision_image_size(224)  # unused by Gemma 4 (as its converter writes it)
    writer.add_vision_patch_size(s.patch_size)
    writer.add_vision_embedding_length(s.n_embd)
    writer.add_vision_feed_forward_length(s.n_ff)
    writer.add_vision_block_count(s.n_layer)
    writer.add_vision_head_count(s.n_head)
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_image_mean([0.0, 0.0, 0.0])
    writer.add_vision_image_std([1.0, 1.0, 1.0])
    writer.add_vision_projector_scale_factor(s.pool)
    writer.add_vision_use_gelu(True)

    rng = np.random.default_rng(s.seed)
    d_head = s.n_embd // s.n_head
    weights = _random_f16(rng)

    conv = rng.standard_normal((s.n_embd, 3, s.patch_size, s.patch_size), dtype=np.float32)
    writer.add_tensor("v.patch_embd.weight", (conv * 0.05).astype(np.float32))
    table = rng.standard_normal((2, s.position_table, s.n_embd), dtype=np.float32) * 0.02
    writer.add_tensor("v.position_embd.weight", table.astype(np.float32))
    for il in range(s.n_layer):
        p = f"v.blk.{il}."
        writer.add_tensor(p + "ln1.weight", ones(s.n_embd))
        writer.add_tensor(p + "attn_q.weight", weights(s.n_embd, s.n_embd))
        writer.add_tensor(p + "attn_k.weight", weights(s.n_embd, s.n_embd))
        writer.add_tensor(p + "attn_v.weight", weights(s.n_embd, s.n_embd))
        writer.add_tensor(p + "attn_q_norm.weight", ones(d_head))
        writer.add_tensor(p + "attn_k_norm.weight", ones(d_head))
        writer.add_tensor(p + "attn_out.weight", weights(s.n_embd, s.n_embd))
        writer.add_tensor(p + "attn_post_norm.weight", ones(s.n_embd))
        writer.add_tensor(p + "ln2.weight", ones(s.n_embd))
        writer.add_tensor(p + "ffn_gate.weight", weights(s.n_ff, s.n_embd))
        writer.add_tensor(p + "ffn_up.weight", weights(s.n_ff, s.n_embd))
        writer.add_tensor(p + "ffn_down.weight", weights(s.n_embd, s.n_ff))
        writer.add_tensor(p + "ffn_post_norm.weight", ones(s.n_embd))
    writer.add_tensor("v.std_bias", np.zeros(s.n_embd, dtype=np.float32))
    writer.add_tensor("v.std_scale", ones(s.n_embd))
    writer.add_tensor("mm.input_projection.weight", weights(text_embd, s.n_embd, scale=0.5))
    if audio is not None:
        _write_audio(writer, audio, text_embd)
    write_out(writer)


def _write_audio(writer: gguf.GGUFWriter, a: AudioShape, text_embd: int) -> None:
    """The audio encoder's keys and tensors (numpy shapes are llama.cpp's reversed)."""
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_string("clip.audio.projector_type", "gemma4a")
    writer.add_uint32("clip.audio.embedding_length", a.n_embd)
    writer.add_uint32("clip.audio.feed_forward_length", a.n_ff)
    writer.add_uint32("clip.audio.block_count", a.n_layer)
    writer.add_uint32("clip.audio.attention.head_count", a.n_head)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.audio.projection_dim", text_embd)
    writer.add_uint32("clip.audio.num_mel_bins", a.n_mel)

    rng = np.random.default_rng(a.seed)
    d_head = a.n_embd // a.n_head
    weights = _random_f16(rng)

    first, second = a.channels
    conv0 = rng.standard_normal((first, 1, 3, 3), dtype=np.float32) * 0.2
    conv1 = rng.standard_normal((second, first, 3, 3), dtype=np.float32) * 0.2
    writer.add_tensor("a.conv1d.0.weight", conv0)
    writer.add_tensor("a.conv1d.0.norm.weight", ones(first))
    writer.add_tensor("a.conv1d.1.weight", conv1)
    writer.add_tensor("a.conv1d.1.norm.weight", ones(second))
    freq = a.n_mel
    for _ in range(2):  # each stride-2 convolution (kernel 3, padding 1) halves the bins
        freq = (freq - 1) // 2 + 1
    writer.add_tensor("a.input_projection.weight", weights(a.n_embd, second * freq))
    for il in range(a.n_layer):
        p = f"a.blk.{il}."
        for half in ("", "_1"):  # the two half-step feed-forwards around the block
            writer.add_tensor(p + f"ffn_norm{half}.weight", ones(a.n_embd))
            writer.add_tensor(p + f"ffn_up{half}.weight", weights(a.n_ff, a.n_embd))
            writer.add_tensor(p + f"ffn_down{half}.weight", weights(a.n_embd, a.n_ff))
            writer.add_tensor(p + f"ffn_post_norm{half}.weight", ones(a.n_embd))
        writer.add_tensor(p + "attn_pre_norm.weight", ones(a.n_embd))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out", "attn_k_rel"):
            writer.add_tensor(p + f"{name}.weight", weights(a.n_embd, a.n_embd))
        writer.add_tensor(p + "per_dim_scale.weight", ones(d_head))
        writer.add_tensor(p + "attn_post_norm.weight", ones(a.n_embd))
        # llama.cpp loads conv_norm as the module's pre-norm and norm_conv after the
        # depthwise convolution (the converter's names are swapped; clip.cpp says so)
        writer.add_tensor(p + "conv_norm.weight", ones(a.n_embd))
        writer.add_tensor(p + "conv_pw1.weight", weights(2 * a.n_embd, a.n_embd))
        writer.add_tensor(p + "conv_dw.weight", weights(a.n_embd, 5, scale=0.2).astype(np.float32))
        writer.add_tensor(p + "norm_conv.weight", ones(a.n_embd))
        writer.add_tensor(p + "conv_pw2.weight", weights(a.n_embd, a.n_embd))
        writer.add_tensor(p + "ln2.weight", ones(a.n_embd))
    writer.add_tensor("a.pre_encode.out.weight", weights(a.out_dim, a.n_embd))
    writer.add_tensor("mm.a.soft_emb_norm.weight", ones(a.out_dim))
    writer.add_tensor("mm.a.input_projection.weight", weights(text_embd, a.out_dim, scale=0.5))
