"""Memory at real Gemma 4 sizes (#46): random-weight models with each size's real attention
shapes, through the core. Their stored blocks keep the bytes per token, per kind of layer,
that the catalog (and so the recommender and the disk estimates) computes from the shapes,
in f16 and q8_0 (and q4_0 at one shape); and a conversation on the largest shape resumes
exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from galahad_desktop.engine import kvstate
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.models.catalog import BY_SIZE, Gemma4Model
from galahad_desktop.vault.keys import MemoryKeyStore
from galahad_dev.real_shapes import SIZES, real_shape_model, shape_of
from tests.helpers import TEST_OVERRIDES, story

pytestmark = pytest.mark.model


def _measured(core: Galahad, text: str) -> tuple[str, int, list[kvstate.Section]]:
    deposited = core.deposit_text("shape.txt", text)
    stored = core.vault.read_block(deposited.block_id)
    state = kvstate.parse(stored.payload, stored.size)
    return deposited.document_id, deposited.tokens, state.sections


def _resumes_exact(core: Galahad, document_id: str) -> None:
    """A conversation on the document, one turn, then resumed in a new engine: grafted
    (nothing re-read) and proven exact."""
    conversation = core.new_conversation(document_id=document_id)
    core.send(conversation, "What does it say?", params=core.sampling(max_tokens=4))
    core.reload_engine()
    report = core.resume(conversation)
    assert report.recomputed_tokens == 0 and report.proof.verdict == "exact", report


def test_each_shape_is_the_real_sizes_attention() -> None:
    for size in SIZES:
        model = BY_SIZE[size.lower()]
        shape = shape_of(model)
        owners = shape.n_layer - shape.shared_kv_layers
        assert shape.n_layer == model.layers and shape.window == model.window
        assert sum(not s for s in shape.swa_pattern[:owners]) == model._owning()[1]
        assert not shape.swa_pattern[owners - 1] and shape.swa_pattern[owners - 2]


@pytest.mark.parametrize("size", SIZES)
def test_blocks_keep_the_bytes_per_token_the_catalog_computes(
    size: str, gemma3_path: Path, tmp_path: Path
) -> None:
    model: Gemma4Model = BY_SIZE[size.lower()]
    path = real_shape_model(size, gemma3_path)
    # q4_0 at one shape (llama.cpp reads it slowly on a CPU): its bytes follow the same rule.
    q4 = (("q4_0", "on"),) if size == "26B-A4B" else ()
    for kv_type, flash in (("f16", "auto"), ("q8_0", "on"), *q4):
        core = Galahad(
            tmp_path / kv_type,
            model_path=path,
            keystore=MemoryKeyStore(),
            overrides={**TEST_OVERRIDES, "n_ctx": 1024, "kv_type": kv_type, "flash_attn": flash},
        )
        try:
            document_id, tokens, sections = _measured(core, story(8))
            if size == "31B" and kv_type == "f16":
                _resumes_exact(core, document_id)
        finally:
            core.close()
        assert tokens < model.window  # every cell of both kinds of layer is kept
        full, window = sections
        assert full.n_cells == tokens and window.n_cells == tokens
        assert full.cell_bytes == model.kv_bytes_per_token_as(kv_type), kv_type
        assert window.cell_bytes * model.window == model.window_bytes_as(kv_type), kv_type
