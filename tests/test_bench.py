"""The benchmark and evaluation commands run end to end (tiny sizes) and report what the
issue asks for. Speed itself is judged from the printed figures, never asserted here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import cli_json

pytestmark = pytest.mark.model


def test_bench_resume_reports_every_method(tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = cli_json(
        "bench",
        "resume",
        "--sizes",
        "150,300",
        "--reps",
        "1",
        "--out",
        str(out),
        data_dir=tmp_path / "unused",
    )
    sizes = (150, 300)
    assert all(r["tokens"] <= s for r, s in zip(result["results"], sizes, strict=True))
    for row in result["results"]:
        for key in (
            "tokens",
            "prefill_ms",
            "restore_ms",
            "proof_ms",
            "floor_ms",
            "seq_file_ms",
            "pickle_state_ms",
            "block_bytes",
        ):
            assert row[key] > 0, key
        assert row["proof"] == "exact"
        assert row["block_bytes"] < row["pickle_state_bytes"]
    assert result["fingerprint"] and (out / "bench-resume.json").exists()
    assert (out / "bench-resume.png").stat().st_size > 1000
    assert not (tmp_path / "unused").exists()  # benchmarks never touch the user's data


def test_bench_persist_and_deposit_rows(tmp_path: Path) -> None:
    persist = cli_json(
        "bench",
        "persist",
        "--sizes",
        "200",
        "--turns",
        "2",
        "--out",
        str(tmp_path),
        data_dir=tmp_path / "unused",
    )
    assert [r["mode"] for r in persist["results"]] == ["chain", "chain", "whole", "whole"]
    assert all(r["persist_ms"] > 0 and r["conversation_tokens"] > 150 for r in persist["results"])
    (summary,) = persist["summary"]
    assert summary["chain_block_bytes"] < summary["whole_block_bytes"]
    assert summary["whole_over_chain"] > 0
    deposit = cli_json(
        "bench",
        "deposit",
        "--sizes",
        "200",
        "--reps",
        "1",
        "--out",
        str(tmp_path),
        data_dir=tmp_path / "unused",
    )
    row = deposit["results"][0]
    assert row["raw_prefill_ms"] > 0 and row["deposit_ms"] > 0 and row["tokens"] <= 200


def test_eval_needles_counts(tmp_path: Path) -> None:
    result = cli_json(
        "eval",
        "needles",
        "--blocks",
        "2",
        "--block-tokens",
        "300",
        "--controls",
        "2",
        "--out",
        str(tmp_path),
        data_dir=tmp_path / "unused",
    )
    assert result["probes"] == 2 and result["controls"] == 2
    assert result["zero_recompute"] == result["probes"]
    assert 0 <= result["exact"] <= result["probes"]
    assert 0 <= result["fabricated"] <= result["controls"]
    assert result["restore_vs_prefill"] > 0 and result["fingerprint"]


def test_eval_memory_counts(tmp_path: Path) -> None:
    result = cli_json(
        "--set",
        "n_ctx=2048",
        "eval",
        "memory",
        "--tokens",
        "3000",
        "--doc-tokens",
        "4500",
        "--probes",
        "3",
        "--controls",
        "3",
        "--out",
        str(tmp_path),
        data_dir=tmp_path / "unused",
    )
    for key in (
        "tokens",
        "probes",
        "routed_right",
        "zero_recompute",
        "exact",
        "controls",
        "fabricated",
        "gate_refusals",
        "rss_start_mb",
        "rss_end_mb",
    ):
        assert key in result, key
    assert result["tokens"] >= 3000 and result["parts"] >= 2
    assert result["probes"] == 3 and result["controls"] == 3
    assert result["routed_right"] == 3  # each record's own part, by name
    assert result["zero_recompute"] == result["answered"]
    assert result["controls_gated"] == 3 and result["fabricated"] == 0
    assert result["rss_end_mb"] > 0 and result["rss_start_mb"] > 0
    assert (tmp_path / "eval-memory.json").exists()
