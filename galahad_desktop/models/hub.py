"""Models: download a Gemma GGUF from the Hugging Face Hub, resumable and SHA-256 checked.

`huggingface_hub` resolves the file (URL, size, and the SHA-256 the Hub publishes as the
LFS etag). The transfer keeps a partial file and resumes it with an HTTP Range request, since
hf_hub_download discards partial files on failure. Nothing is installed unless the whole file
matches the published SHA-256; then it is renamed into place atomically.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from galahad_desktop.errors import InputError, IntegrityError
from galahad_desktop.jobs import NO_JOB, Job, Progress
from galahad_desktop.paths import ensure_private_dir
from galahad_desktop.system.files import fsync_dir, open_private

CHUNK = 1024 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Downloaded:
    path: Path
    sha256: str
    size: int
    resumed_from: int


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


# Names of the exceptions (httpx's, requests', the standard library's) that mean the Hub
# could not be reached at all, as opposed to an answer saying the file is not there.
_OFFLINE = (
    "ConnectError",
    "ConnectionError",
    "ConnectTimeout",
    "Timeout",
    "TimeoutError",
    "ReadTimeout",
    "LocalEntryNotFoundError",
    "OfflineModeIsEnabled",
    "URLError",
    "gaierror",
    "ProxyError",
    "SSLError",
)


def _hub_problem(exc: BaseException, repo_id: str, filename: str) -> str:
    """What went wrong asking the Hub for a file, for the user: offline, or not there."""
    chain = [exc, exc.__cause__, exc.__context__]
    names = {type(e).__name__ for e in chain if e is not None}
    if names & set(_OFFLINE):
        return (
            "No connection to the model hub (huggingface.co): check the network, or a "
            "proxy setting, and try again. Nothing was downloaded; the current model stays."
        )
    return f"Could not find '{filename}' in '{repo_id}' on the Hub: {type(exc).__name__}."


def _published(repo_id: str, filename: str, revision: str | None) -> tuple[str, int, str]:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    endpoint = os.environ.get("HF_ENDPOINT") or None
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url)
    except Exception as exc:  # huggingface_hub raises many types for network and 404s
        raise InputError(_hub_problem(exc, repo_id, filename)) from None
    sha = (meta.etag or "").strip('"').lower()
    if not _SHA256.match(sha):
        raise IntegrityError(
            f"The Hub publishes no SHA-256 for '{filename}', so it cannot be verified; refused."
        )
    if not meta.size:
        raise InputError(f"The Hub reports no size for '{filename}'.")
    return meta.location or url, int(meta.size), sha


def download_gguf(
    repo_id: str,
    filename: str,
    models_dir: Path,
    revision: str | None = None,
    job: Job = NO_JOB,
) -> Downloaded:
    """Progress is reported in bytes (done of total)."""
    if not filename.lower().endswith(".gguf"):
        raise InputError(f"'{filename}' is not a .gguf file.")
    url, size, sha = _published(repo_id, filename, revision)
    models_dir = ensure_private_dir(models_dir)
    final = models_dir / Path(filename).name
    if final.exists() and final.stat().st_size == size and sha256_of(final) == sha:
        # A file of that name is kept only when its bytes are the published ones.
        return Downloaded(final, sha, size, size)
    partial = models_dir / f".partial-{sha[:16]}-{final.name}"
    digest = hashlib.sha256()
    have = 0
    if partial.exists():
        with open(partial, "rb") as handle:
            while block := handle.read(CHUNK):
                digest.update(block)
                have += len(block)
        if have > size:
            partial.unlink()
            digest, have = hashlib.sha256(), 0
    resumed_from = have
    start = time.monotonic()
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            if have and response.status != 206:  # the server ignored Range: start over
                digest, have = hashlib.sha256(), 0
                mode = "wb"
            else:
                mode = "ab" if have else "wb"
            fd = open_private(partial, exclusive=False)
            with os.fdopen(fd, mode) as out:
                if mode == "wb":
                    out.truncate(0)
                while True:
                    job.check(
                        f"Download of '{filename}' paused at {have:,} of {size:,} bytes; "
                        "start it again to resume."
                    )
                    block = response.read(CHUNK)
                    if not block:
                        break
                    out.write(block)
                    digest.update(block)
                    have += len(block)
                    job.progress(Progress(have, size, time.monotonic() - start))
                out.flush()
                os.fsync(out.fileno())
    except (urllib.error.URLError, OSError, ConnectionError) as exc:
        raise InputError(
            f"The download of '{filename}' was interrupted at {have:,} of {size:,} bytes "
            f"({type(exc).__name__}); start it again to resume."
        ) from None
    if have != size:
        raise InputError(
            f"The download of '{filename}' stopped at {have:,} of {size:,} bytes; start it "
            "again to resume."
        )
    if digest.hexdigest() != sha:
        partial.unlink()
        raise IntegrityError(
            f"'{filename}' does not match the SHA-256 the Hub publishes; it was deleted."
        )
    os.replace(partial, final)
    fsync_dir(models_dir)
    return Downloaded(final, sha, size, resumed_from)
