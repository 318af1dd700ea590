"""A device server that goes away must not take the app with it.

llama.cpp's RPC client talks to a device server from a dispatcher thread of its own; when the
connection breaks (the server was stopped, crashed, or its computer slept) that thread calls
`ggml_abort`, which ends the whole process, and every call waiting on it would wait forever.
Two things keep the app alive instead:

- `ggml_abort` runs a callback first (`ggml_set_abort_callback`). While a model is on a device
  server, the callback marks that model's calls as lost and keeps the failing thread waiting
  for ever (it is llama.cpp's own thread; returning would abort). Without a model on a
  device server, llama.cpp aborts as it always did.
- A model on a device server makes every llama.cpp call on a thread of its own
  (`NativeThread`); the caller waits for the answer or the loss, whichever comes first. A lost
  model's thread may never return: it is left waiting, and the model's native memory is
  never freed (freeing it would talk to the server again). The engine is then loaded again
  without that server (memory/model_files.py leaves out `lost_servers()`).

Importing this module loads no llama.cpp; the callback is set through libggml when the
first model goes onto a device server.
"""

from __future__ import annotations

import ctypes
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from galahad_desktop.errors import DeviceLostError

T = TypeVar("T")


_Call = tuple[Callable[..., Any], tuple[Any, ...], "Future[Any]"]


class NativeThread:
    """The one thread that makes a device-backed model's llama.cpp calls (a
    llama_api.NativeCalls)."""

    def __init__(self, servers: tuple[str, ...]) -> None:
        self.servers = servers
        self.lost: str = ""  # why, once the device server has gone away
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._pending: set[Future[Any]] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="galahad-device", daemon=True)
        self._thread.start()
        _watch(self)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        if threading.get_ident() == self._thread.ident:
            return fn(*args)  # already on this thread (a call made inside a call)
        future: Future[T] = Future()
        with self._lock:
            if self.lost:
                raise DeviceLostError(self.lost)
            self._pending.add(future)
        self._calls.put((fn, args, future))
        try:
            return future.result()
        finally:
            with self._lock:
                self._pending.discard(future)

    def release(self, fn: Callable[..., Any], *args: Any) -> None:
        """Free native memory, unless the server is gone (freeing would wait on it)."""
        if not self.lost:
            self.call(fn, *args)

    def lose(self, why: str) -> None:
        """The device server went away: every waiting call, and every later one, fails."""
        _LOST.update(self.servers)  # before any caller wakes: it loads the engine again
        with self._lock:
            if not self.lost:
                self.lost = why
            waiting = list(self._pending)
        for future in waiting:
            _settle(future, DeviceLostError(why))

    def close(self) -> None:
        """Stop the thread once its calls are done (a lost thread is left where it waits)."""
        _unwatch(self)
        self._calls.put(None)

    def _serve(self) -> None:
        for fn, args, future in iter(self._calls.get, None):  # None: closed
            if future.done():
                continue  # settled by a loss before it ran
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, who raises it
                _settle(future, exc)
            else:
                _settle(future, result, ok=True)


def _settle(future: Future[Any], value: Any, ok: bool = False) -> None:
    try:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    except InvalidStateError:
        pass  # the loss settled it first


# -- the abort callback --------------------------------------------------------------------

_WATCHED: set[NativeThread] = set()
_LOST: set[str] = set()  # device servers that went away in this process
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_installed: list[Any] = []  # the callback object, kept alive for llama.cpp
_install_lock = threading.Lock()


def lost_servers() -> frozenset[str]:
    """The device servers that went away in this process: never used again by it (the
    connection's dispatcher thread is gone; a new connection needs a new process)."""
    return frozenset(_LOST)


def _watch(native: NativeThread) -> None:
    with _install_lock:
        _WATCHED.add(native)
        if not _installed:
            # Here, not at import: importing this module (for lost_servers) loads no llama.cpp.
            from galahad_desktop.engine import devices

            callback = _ABORT_CALLBACK(_on_abort)
            lib = devices.ggml_library()
            lib.ggml_set_abort_callback.restype = ctypes.c_void_p
            lib.ggml_set_abort_callback.argtypes = [_ABORT_CALLBACK]
            lib.ggml_set_abort_callback(callback)
            _installed.append(callback)


def _unwatch(native: NativeThread) -> None:
    with _install_lock:
        _WATCHED.discard(native)


def _on_abort(message: bytes | None) -> None:
    why = (message or b"").decode("utf-8", "replace")
    with _install_lock:
        watched = list(_WATCHED)
    if not watched:
        print(why, file=sys.stderr, flush=True)  # llama.cpp's own message; it aborts now
        return
    reason = why.rsplit(": ", 1)[-1] if ": " in why else why
    for native in watched:
        servers = ", ".join(native.servers)
        native.lose(
            f"The device server at {servers} went away: the model runs without it for the "
            "rest of this session (restart Galahad to use it again). llama.cpp said: "
            f"{reason.strip() or 'no answer'}."
        )
    threading.Event().wait()  # returning would let llama.cpp abort the process
