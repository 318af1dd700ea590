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
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from galahad_dev.gemma4_model import Gemma4Shape, cache_dir, write_once, write_out

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


def _fingerprint(shape: ProjectorShape, text_embd: int) -> str:
    payload = json.dumps(
        {"shape": asdict(shape), "text_embd": text_embd, "builder": BUILDER_VERSION},
        sort_keys=True,
    ).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def build(
    text_shape: Gemma4Shape | None = None,
    out_dir: Path | None = None,
    shape: ProjectorShape | None = None,
) -> Path:
    """The test projector's path (for the Gemma 4 test model), built unless cached."""
    shape = shape or ProjectorShape()
    text_embd = (text_shape or Gemma4Shape()).n_embd
    out_dir = out_dir or cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"mmproj-gemma4-test-{_fingerprint(shape, text_embd)}.gguf"
    if target.exists():
        return target
    return write_once(target, lambda tmp: _write(tmp, shape, text_embd))


def _write(path: Path, s: ProjectorShape, text_embd: int) -> None:
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

    def weights(*dims: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * scale).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

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
    write_out(writer)
