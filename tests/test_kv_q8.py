"""The q8_0 KV cache end to end (#22), on both model families: half the bytes per stored
token, reading in an f16 context and converting, every proof exact, and the runtime
fingerprint telling f16 blocks from q8_0 ones. (The graft tests in test_graft.py also run
under the q8_0 runtime.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from galahad_desktop.memory.galahad import Galahad
from tests.helpers import story

pytestmark = pytest.mark.model

Q8 = {"kv_type": "q8_0", "flash_attn": "on"}


def test_q8_0_blocks_are_half_the_bytes_and_every_path_is_exact(
    tmp_path: Path, make_core: Callable[..., Galahad], family: str
) -> None:
    text = story(120)
    f16 = make_core(data=tmp_path / "f16", flash_attn="on")
    f16_bytes = f16.deposit_text("story.txt", text).block_bytes
    f16.close()
    core = make_core(**Q8)
    deposited = core.deposit_text("story.txt", text)
    assert deposited.block_bytes <= 0.56 * f16_bytes, (deposited.block_bytes, f16_bytes)
    engine = core.engine
    assert engine.reads_in_f16 and engine.fingerprint_details.kv_type == "q8_0"
    conversation = core.new_conversation(document_id=deposited.document_id)
    first = core.send(
        conversation, "What is Arthur's access code?", params=core.sampling(max_tokens=6)
    )
    assert first.counters.recomputed_tokens == 0
    core.send(conversation, "Say it again.", params=core.sampling(max_tokens=6))
    regenerated = core.regenerate(conversation, params=core.sampling(max_tokens=6))
    assert regenerated.graft is None or regenerated.graft.proof.verdict == "exact"
    core.compact(conversation)
    core.close()
    again = make_core(**Q8)  # a fresh engine: everything grafts from disk
    report = again.resume(conversation)
    assert report.proof.verdict == "exact" and report.recomputed_tokens == 0
    assert {r.proof for r in again.verify()} == {"exact"}
    assert again.audit().problems == []
    again.close()


def test_an_f16_block_is_reread_under_q8_0_and_the_rotation_switch_is_in_the_fingerprint(
    tmp_path: Path, make_core: Callable[..., Galahad], monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(flash_attn="on")
    deposited = core.deposit_text("story.txt", story(40))
    core.close()
    q8 = make_core(**Q8)
    conversation = q8.new_conversation(document_id=deposited.document_id)
    report = q8.resume(conversation)
    assert report.fallback_reason == "the model or its runtime settings changed"
    assert report.recomputed_tokens == deposited.tokens
    fingerprint = q8.engine.fingerprint
    q8.close()
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")  # quantized K and V stored unrotated
    unrotated = make_core(**Q8)
    assert unrotated.engine.fingerprint_details.attn_rot_disabled is True
    assert unrotated.engine.fingerprint != fingerprint
    again = unrotated.resume(conversation)
    assert again.fallback_reason == "the model or its runtime settings changed"
    unrotated.close()


def test_an_import_and_a_long_document_in_parts_under_q8_0(
    tmp_path: Path, make_core: Callable[..., Galahad]
) -> None:
    transcript = tmp_path / "chat.md"
    transcript.write_text("## You\n\nHello there.\n\n## Gemma\n\nHello, how can I help?\n")
    core = make_core(**Q8, n_ctx=2048)
    imported = core.import_conversations(transcript)
    assert len(imported.conversations) == 1
    long_doc = core.deposit_text("long.txt", story(400, secret="The vault word is heron."))
    assert long_doc.n_parts > 1
    answer = core.ask(
        "What is the vault word?", long_doc.document_id, params=core.sampling(max_tokens=4)
    )
    assert answer.graft is None or answer.graft.proof.verdict == "exact"
    assert {r.proof for r in core.verify()} == {"exact"}
    core.close()


def test_kv_quality_runs_on_the_gemma4_test_model(gemma4_path: Path) -> None:
    """Mechanics only (random weights): every run reads the same tokens and is compared."""
    from galahad_dev import bench

    result = bench.bench_kv_quality(
        256, 16, bench.Run(gemma4_path, {"n_threads": 2}, lambda _l: None)
    )
    assert [r["run"] for r in result["results"]] == [name for name, _c in bench.QUALITY_RUNS]
    for row in result["results"][1:]:
        assert row["kl_mean"] >= 0 and 0 <= row["top1_agreement"] <= 1
    assert result["fingerprint_details"]["kv_type"] == "f16"  # the core's own engine
