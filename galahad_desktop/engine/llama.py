"""llama.cpp's Python bindings, loaded on the engine's first call rather than on import.

Importing `llama_cpp` loads libllama and libggml (a quarter of a second on 2 cores), which
the window's first frame and the command's quick paths (settings, a refusal, `--help`)
never need. Engine modules write `from galahad_desktop.engine.llama import llama_cpp` (and
`mtmd`) and use them as the modules they stand for (mypy sees the real ones); the first
attribute read imports the library and, before anything else runs, routes llama.cpp's log
into `_llama_log`: off stderr unless GALAHAD_LLAMA_LOG=1, and kept while a model loads
(`captured_log`), the only record of where its weights and KV cache went.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

_LOG_TO_STDERR = os.environ.get("GALAHAD_LLAMA_LOG") == "1"
_log_capture: list[str] | None = None  # llama.cpp's lines while a model loads
_loaded: dict[str, ModuleType] = {}
_lock = threading.RLock()
_callback: Any = None  # the C callback: kept, or llama.cpp would call freed memory


def _llama_log(level: int, text: bytes, user_data: Any) -> None:
    line = text.decode("utf-8", "replace")
    if _log_capture is not None:
        _log_capture.append(line)
    if _LOG_TO_STDERR:
        sys.stderr.write(line)


def load(name: str = "llama_cpp") -> ModuleType:
    """The module `name` (llama_cpp or one of its submodules), imported once; the first
    import of llama_cpp sets its log callback before it returns."""
    module = _loaded.get(name)
    if module is not None:
        return module
    global _callback
    with _lock:
        if "llama_cpp" not in _loaded:
            root = importlib.import_module("llama_cpp")
            _callback = root.llama_log_callback(_llama_log)
            root.llama_log_set(_callback, ctypes.c_void_p(0))
            _loaded["llama_cpp"] = root
        if name not in _loaded:
            _loaded[name] = importlib.import_module(name)
        return _loaded[name]


def log_callback() -> Any:
    """The callback that keeps llama.cpp's messages off stderr (for mtmd, which has its own
    logger)."""
    load()
    return _callback


@contextlib.contextmanager
def captured_log() -> Iterator[list[str]]:
    """Keep what llama.cpp says meanwhile: while loading, it names the buffers it put on
    each device."""
    global _log_capture
    lines: list[str] = []
    _log_capture = lines
    try:
        yield lines
    finally:
        _log_capture = None


class _Deferred:
    """A module imported at its first attribute read."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(load(self._name), attribute)


if TYPE_CHECKING:
    import llama_cpp as llama_cpp
    import llama_cpp.mtmd_cpp as mtmd
else:
    llama_cpp = _Deferred("llama_cpp")
    mtmd = _Deferred("llama_cpp.mtmd_cpp")

__all__ = ["captured_log", "llama_cpp", "load", "log_callback", "mtmd"]
