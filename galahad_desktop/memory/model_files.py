"""The models a data directory can use: the embedded demo, downloaded GGUFs, the configured
file; the engine configuration that follows from the settings; downloads from the Hub."""

from __future__ import annotations

from pathlib import Path

from galahad_desktop.engine.device_guard import lost_servers
from galahad_desktop.engine.values import EngineConfig
from galahad_desktop.errors import InputError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.results import ModelFile
from galahad_desktop.models import catalog
from galahad_desktop.models.hub import Downloaded, download_gguf
from galahad_desktop.paths import default_model_path, ensure_private_dir
from galahad_desktop.settings import Settings


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def engine_config(settings: Settings, model_path: Path | None) -> EngineConfig:
    values = settings.values
    configured = values.model_path
    chosen = model_path or (Path(configured) if configured else None)
    embedded = default_model_path()
    path = chosen or embedded
    return EngineConfig(
        model_path=path,
        n_ctx=values.n_ctx,
        n_gpu_layers=values.n_gpu_layers,
        # A server that went away in this process is left out (engine/device_guard.py).
        rpc_servers=tuple(
            e.strip()
            for e in values.rpc_servers.split(",")
            if e.strip() and e.strip() not in lost_servers()
        ),
        n_threads=values.n_threads,
        n_batch=values.n_batch,
        n_ubatch=values.n_ubatch,
        flash_attn=flash_attention(values.flash_attn),
        kv_type=values.kv_type,
        read_in_f16=values.read_in_f16,
        swa_full=values.swa_full,
        embedded=same_file(path, embedded),
    )


def flash_attention(setting: str) -> bool:
    """auto is on: on this project's CPU measurements flash attention with the ring-buffer
    sliding window read documents 1.5-2.1x faster (docs/performance.md), and it is
    llama.cpp's own default on a GPU; every proof stays exact either way."""
    return setting != "off"


def download_into(models_dir: Path, repo: str, filename: str, job: Job = NO_JOB) -> Downloaded:
    """A GGUF (resumable, SHA-256 checked against the Hub) into `models_dir`."""
    return download_gguf(repo, filename, ensure_private_dir(models_dir), job=job)


class ModelShelf:
    def __init__(self, data_dir: Path, settings: Settings, model_path: Path | None) -> None:
        self.models_dir = data_dir / "models"
        self.settings = settings
        self.model_path = model_path

    def files(self) -> list[ModelFile]:
        in_use = engine_config(self.settings, self.model_path).model_path
        seen: dict[Path, ModelFile] = {}
        embedded = default_model_path()
        candidates = [embedded]
        if self.models_dir.is_dir():
            candidates += sorted(self.models_dir.glob("*.gguf"))
        if self.settings.values.model_path:
            candidates.append(Path(self.settings.values.model_path))
        candidates.append(Path(in_use))  # a model given for this run (--model) is listed too
        for path in candidates:
            try:
                key = path.resolve()
                size = path.stat().st_size
            except OSError:
                continue
            if key not in seen:
                seen[key] = ModelFile(
                    str(path),
                    "Gemma 3 270M (embedded demo)" if same_file(path, embedded) else path.stem,
                    size,
                    same_file(path, embedded),
                    same_file(path, in_use),
                )
        return list(seen.values())

    def download(
        self,
        repo: str,
        filename: str,
        job: Job = NO_JOB,
    ) -> Downloaded:
        """A GGUF (resumable, SHA-256 checked against the Hub) into the models folder."""
        return download_into(self.models_dir, repo, filename, job)

    @staticmethod
    def gemma4_for(size: str | None) -> catalog.Gemma4Model:
        """The catalog's Gemma 4 of `size` (default: the one recommended for this machine)."""
        if size is None:
            recommendation = catalog.recommend()
            if recommendation.recommended is None:
                raise InputError(recommendation.reason)
            size = recommendation.recommended
        return catalog.model_for(size)


class ModelDownloads:
    """Model files fetched beside the core (the window's downloads lane): it writes only the
    models folder and never touches the engine, the vault or the settings, so a download
    runs while the chat goes on; switching to the file is then the core's `use_model`."""

    def __init__(self, data_dir: Path) -> None:
        self.models_dir = Path(data_dir) / "models"

    def get_gemma4(self, size: str | None = None, job: Job = NO_JOB) -> Downloaded:
        chosen = ModelShelf.gemma4_for(size)
        return download_into(self.models_dir, chosen.repo, chosen.file, job)
