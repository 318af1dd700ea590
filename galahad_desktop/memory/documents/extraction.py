"""Text extraction for deposited documents: plain text and source files, Markdown, PDF, DOCX.

Every failure is an InputError naming the file and the problem. Work is bounded: files over
MAX_FILE_BYTES are refused before reading, DOCX archives whose unpacked size is out of
proportion (zip bombs) are refused before parsing, and extracted text is capped.
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from galahad_desktop.errors import CancelledError, InputError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.system.child import run_bounded

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_TEXT_CHARS = 8 * 1024 * 1024
MAX_DOCX_UNPACKED = 256 * 1024 * 1024
TEXT_SUFFIXES = frozenset(
    [
        ".txt",
        ".md",
        ".markdown",
        ".rst",
        ".org",
        ".csv",
        ".tsv",
        ".log",
        ".json",
        ".jsonl",
        ".yaml",
        ".yml",
        ".toml",
        ".ini",
        ".cfg",
        ".xml",
        ".html",
        ".htm",
        ".css",
        ".py",
        ".pyi",
        ".js",
        ".ts",
        ".tsx",
        ".jsx",
        ".c",
        ".h",
        ".cc",
        ".cpp",
        ".hpp",
        ".rs",
        ".go",
        ".java",
        ".kt",
        ".swift",
        ".rb",
        ".php",
        ".sh",
        ".bash",
        ".zsh",
        ".sql",
        ".r",
        ".m",
        ".scala",
        ".lua",
        ".pl",
        ".tex",
        ".ipynb",
        ".vue",
        ".svelte",
    ]
)
SUPPORTED = "text and source files, .md, .pdf and .docx, and pictures"


class NoTextLayer(InputError):
    """A PDF whose pages carry no text (a scan): read as pictures instead."""


_SIGNATURES = (
    (b"%PDF-", "a PDF", ".pdf"),
    (b"PK\x03\x04", "a ZIP archive (e.g. .docx)", ".docx"),
    (b"\x89PNG", "a PNG image", None),
    (b"\xff\xd8\xff", "a JPEG image", None),
    (b"\x7fELF", "a program", None),
    (b"GGUF", "a model file", None),
)


def _decode_text(data: bytes, name: str) -> str:
    for magic, what, suffix in _SIGNATURES:
        if data.startswith(magic):
            hint = f"; rename it to {suffix}" if suffix else ""
            raise InputError(f"'{name}' looks like {what}, not text{hint}.")
    if b"\x00" in data[:65536]:
        raise InputError(f"'{name}' looks like a binary file, not text ({SUPPORTED}).")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"'{name}' is not valid UTF-8 text (bad byte at offset {exc.start})."
        ) from None
    if "\x00" in text:  # past the first 64 KiB: the model would stop reading at it
        raise InputError(
            f"'{name}' contains NUL characters (first at byte {data.index(0):,}); it looks "
            "like a binary file, not text."
        )
    return text


def _pdf_text(path: Path) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(path, strict=False)
        if reader.is_encrypted:
            raise InputError(f"'{path.name}' is an encrypted PDF; decrypt it first.")
        pages = []
        total = 0
        for page in reader.pages:
            text = page.extract_text() or ""
            total += len(text)
            if total > MAX_TEXT_CHARS:
                raise InputError(f"'{path.name}' holds more text than one document may.")
            pages.append(text)
    except InputError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        raise InputError(f"'{path.name}' is not a readable PDF: {exc}") from None
    return "\n\n".join(pages)


def _docx_text(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
            if unpacked > MAX_DOCX_UNPACKED:
                raise InputError(
                    f"'{path.name}' unpacks to {unpacked / 1e6:.0f} MB; refused as a "
                    "possible zip bomb."
                )
    except zipfile.BadZipFile:
        raise InputError(f"'{path.name}' is not a readable .docx (not a zip archive).") from None
    import docx

    try:
        document = docx.Document(str(path))
    except Exception as exc:  # python-docx raises many types on malformed input
        raise InputError(f"'{path.name}' is not a readable .docx: {exc}") from None
    parts = [paragraph.text for paragraph in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            parts.append(" | ".join(cell.text for cell in row.cells))
    return "\n".join(parts)


def extract_text(path: Path) -> str:
    """The document's text, or an InputError that names the file and the problem."""
    path = Path(path)
    _precheck(path)
    return _extract(path)


def check_source_file(path: Path, max_bytes: int, what: str) -> None:
    """Quick refusals before a child is started: missing, not a file, empty, too big."""
    if not path.exists():
        raise InputError(f"'{path}' does not exist.")
    if not path.is_file():
        raise InputError(f"'{path}' is not a file.")
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"'{path.name}' is empty.")
    if size > max_bytes:
        raise InputError(
            f"'{path.name}' is {size / 2**20:,.0f} MiB; {what} may be at most "
            f"{max_bytes / 2**20:.0f} MiB."
        )


def _precheck(path: Path) -> None:
    check_source_file(path, MAX_FILE_BYTES, "documents")
    suffix = path.suffix.lower()
    if suffix not in (".pdf", ".docx", "") and suffix not in TEXT_SUFFIXES:
        raise InputError(f"'{path.name}': the type '{suffix}' is not supported ({SUPPORTED}).")


def _extract(path: Path) -> str:
    suffix = path.suffix.lower()
    try:
        if suffix == ".pdf":
            text = _pdf_text(path)
        elif suffix == ".docx":
            text = _docx_text(path)
        elif suffix in TEXT_SUFFIXES or suffix == "":
            text = _decode_text(path.read_bytes(), path.name)
        else:
            raise InputError(f"'{path.name}': the type '{suffix}' is not supported ({SUPPORTED}).")
    except PermissionError:
        raise InputError(f"'{path.name}' cannot be read (permission denied).") from None
    text = text.replace("\r\n", "\n").strip()
    if not text and suffix == ".pdf":
        raise NoTextLayer(f"'{path.name}' has no text layer (a scan).")
    if not text:
        raise InputError(f"'{path.name}' contains no text.")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"'{path.name}' holds more text than one document may.")
    return text


def extract_text_bounded(
    path: Path,
    timeout_s: float = 120.0,
    memory_mb: int = 2048,
    job: Job = NO_JOB,
) -> str:
    """extract_text in a child process with memory, CPU and wall-clock limits; cancellable.

    Quick refusals (missing, empty, too big, unsupported type) happen here without a child.
    """
    path = Path(path)
    _precheck(path)
    result = run_reader(path, "text", timeout_s, memory_mb, job)
    return str(result["text"])


def run_reader(
    path: Path, mode: str, timeout_s: float, memory_mb: int, job: Job, stdin: bytes | None = None
) -> dict[str, Any]:
    """The document reader (extract_worker) on `path` in a limited child: its JSON result,
    or the InputError it reported (NoTextLayer for a PDF without text). With `stdin`, the
    bytes are the file and `path` only its name."""
    if getattr(sys, "frozen", False):
        command = [sys.executable, "--extract-worker", str(path), mode]
    else:
        worker = "galahad_desktop.memory.documents.extract_worker"
        command = [sys.executable, "-m", worker, str(path), mode]
    done = run_bounded(command, timeout_s, memory_mb, job, stdin)
    if done.cancelled:
        raise CancelledError(f"Reading '{path.name}' was cancelled; nothing was stored.")
    if done.timed_out:
        raise InputError(f"'{path.name}' took longer than {timeout_s:.0f} s to read; refused.")
    if not done.stdout:
        raise InputError(
            f"'{path.name}' could not be read within the limits ({memory_mb} MB of memory, "
            f"{timeout_s:.0f} s); the reader stopped with code {done.returncode}."
        )
    try:
        result = json.loads(done.stdout)
    except ValueError:
        raise InputError(
            f"'{path.name}' could not be read (the reader's output was cut)."
        ) from None
    if not isinstance(result, dict):
        raise InputError(f"'{path.name}' could not be read (the reader's answer was not one).")
    if "error" in result:
        raise NoTextLayer(result["error"]) if result.get("no_text") else InputError(result["error"])
    return result


_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def split_for_parts(text: str, budget: int, count: Callable[[str], int]) -> list[str]:
    """Cut text into parts of at most about `budget` tokens (by `count`), at paragraph
    breaks where possible, then sentences, then words, then characters."""
    if budget < 16:
        raise InputError(f"A document part needs room for at least 16 tokens, not {budget}.")
    units: list[tuple[str, str, int]] = []  # (separator before it, text, tokens)

    def add(piece: str, level: int, separator: str) -> None:
        piece = piece.strip()
        if not piece:
            return
        if level == 3:  # characters: a quarter of the budget cannot exceed it
            units.append((separator, piece, count(piece)))
            return
        n = count(piece)
        if n <= budget:
            units.append((separator, piece, n))
            return
        if level == 0:
            pieces = _SENTENCE.split(piece)
        elif level == 1:
            words = piece.split()
            size = max(1, len(words) * budget // (2 * n))
            pieces = [" ".join(words[i : i + size]) for i in range(0, len(words), size)]
        else:
            size = max(1, budget // 4)
            pieces = [piece[i : i + size] for i in range(0, len(piece), size)]
        inner = ("\n\n", " ", " ")[level] if level < 2 else ""
        for index, sub in enumerate(pieces):
            add(sub, level + 1, separator if index == 0 else inner)

    for paragraph in _PARAGRAPH.split(text):
        add(paragraph, 0, "\n\n")
    parts: list[str] = []
    current: list[str] = []
    used = 0
    for separator, piece, n in units:
        if current and used + n + 1 > budget:
            parts.append("".join(current).strip())
            current, used = [], 0
        current.append((separator if current else "") + piece)
        used += n + 1
    if current:
        parts.append("".join(current).strip())
    return parts


def overlap_tail(text: str, tokens: int, count: Callable[[str], int] | None = None) -> str:
    """The end of a part, at most about `tokens` long (by `count`; without it, ~1.4 tokens a
    word), starting at a word where the text has words: repeated at the start of the next
    part so a sentence cut at the boundary is read whole. Text without spaces (Chinese,
    Japanese, minified code) is cut by characters, never taken whole."""
    if tokens <= 0 or not text:
        return ""
    count = count or (lambda piece: int(len(piece.split()) * 1.4 + 0.5))
    words = text.split()
    if len(words) > 1:
        taken: list[str] = []
        for word in reversed(words):
            if taken and count(" ".join([word, *taken])) > tokens:
                break
            taken.insert(0, word)
        tail = " ".join(taken)
        if count(tail) <= tokens:
            return tail
        text = tail  # one word longer than the overlap: cut it by characters below
    low, high = 0, min(len(text), tokens * 8)
    while low < high:  # the longest suffix that fits
        middle = (low + high + 1) // 2
        if count(text[-middle:]) <= tokens:
            low = middle
        else:
            high = middle - 1
    return text[-low:] if low else ""
