"""llama.cpp's backends and devices: which CPU kernels run, which GPU (or remote) device holds
the model and its KV cache, and how many layers fit there.

The build (scripts/setup.sh) makes every backend a loadable module: the CPU backend in one
variant per x86-64 level (x86-64 up to AVX-512 VNNI/BF16; llama.cpp scores each against this
CPU and loads the fastest that runs here), the RPC backend, and a GPU backend where the machine
can build one. Modules must be loaded before a model is; `load_backends()` does it once per
process. A build with backends linked in (an older .venv) needs nothing loaded and works too.

llama.cpp's AMX kernels are never built or shipped: they crash on Intel Xeons with AMX
(upstream issue #20824, "segfault in ggml_backend_amx_mul_mat"). Such a CPU runs the AVX-512
variant with llama.cpp's repacked kernels.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ipaddress
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import llama_cpp

from galahad_desktop.engine.native import ContextSettings, NativeContext, NativeModel
from galahad_desktop.errors import InputError, ModelError
from galahad_desktop.sockets import listen

DeviceKind = Literal["CPU", "GPU", "iGPU", "accelerator", "other"]

_LOG_TO_STDERR = os.environ.get("GALAHAD_LLAMA_LOG") == "1"
_log_capture: list[str] | None = None  # llama.cpp's lines while a model loads


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def _llama_log(level: int, text: bytes, user_data: Any) -> None:
    # llama.cpp and ggml write to stderr even with verbose=False; keep the CLI's stderr for
    # our own messages unless asked (GALAHAD_LLAMA_LOG=1). Set here, in the lowest module
    # that touches llama.cpp, before any backend is loaded.
    line = text.decode("utf-8", "replace")
    if _log_capture is not None:
        _log_capture.append(line)
    if _LOG_TO_STDERR:
        sys.stderr.write(line)


llama_cpp.llama_log_set(_llama_log, ctypes.c_void_p(0))


@contextlib.contextmanager
def captured_log() -> Iterator[list[str]]:
    """Keep what llama.cpp says meanwhile: while loading, it names the buffers it put on
    each device (the only record of where the weights and the KV cache actually live)."""
    global _log_capture
    lines: list[str] = []
    _log_capture = lines
    try:
        yield lines
    finally:
        _log_capture = None


DEVICE_CPU, DEVICE_GPU, DEVICE_IGPU, DEVICE_ACCEL = 0, 1, 2, 3
GIB = 1024**3


class _Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


def llama_cpp_version() -> str:
    return str(llama_cpp.__version__)


def library_dir() -> Path:
    """Where llama-cpp-python keeps llama.cpp's libraries (and the backend modules)."""
    return Path(llama_cpp.__file__).resolve().parent / "lib"


def _shared_name(stem: str) -> str:
    return {"win32": f"{stem}.dll", "darwin": f"lib{stem}.dylib"}.get(sys.platform, f"lib{stem}.so")


def _loaded_ggml() -> Path:
    """The libggml file libllama loaded. It must be that very file: a wheel stores the
    library's versioned names as separate copies, and another copy has its own (empty)
    backend registry."""
    with contextlib.suppress(OSError):
        maps = Path("/proc/self/maps").read_text("utf-8", "replace")
        found = re.search(r"(/\S*/libggml\.so(?:\.\d+)*)\n", maps)
        if found:
            return Path(found.group(1))
    for name in ("libggml.so.0", "libggml.0.dylib", _shared_name("ggml")):
        if (library_dir() / name).exists():
            return library_dir() / name
    return library_dir() / _shared_name("ggml")


@functools.cache
def _ggml() -> ctypes.CDLL:
    """libggml: the backend registry, the same copy libllama uses."""
    lib = ctypes.CDLL(str(_loaded_ggml()))
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "ggml_backend_load_all_from_path": (None, [ctypes.c_char_p]),
        "ggml_backend_reg_count": (ctypes.c_size_t, []),
        "ggml_backend_register": (None, [ctypes.c_void_p]),
        "ggml_backend_reg_get": (ctypes.c_void_p, [ctypes.c_size_t]),
        "ggml_backend_reg_by_name": (ctypes.c_void_p, [ctypes.c_char_p]),
        "ggml_backend_reg_name": (ctypes.c_char_p, [ctypes.c_void_p]),
        "ggml_backend_reg_get_proc_address": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
        "ggml_backend_reg_dev_count": (ctypes.c_size_t, [ctypes.c_void_p]),
        "ggml_backend_reg_dev_get": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
        "ggml_backend_dev_count": (ctypes.c_size_t, []),
        "ggml_backend_dev_get": (ctypes.c_void_p, [ctypes.c_size_t]),
        "ggml_backend_dev_name": (ctypes.c_char_p, [ctypes.c_void_p]),
        "ggml_backend_dev_description": (ctypes.c_char_p, [ctypes.c_void_p]),
        "ggml_backend_dev_type": (ctypes.c_int, [ctypes.c_void_p]),
        "ggml_backend_dev_backend_reg": (ctypes.c_void_p, [ctypes.c_void_p]),
        "ggml_backend_dev_memory": (
            None,
            [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


def ggml_library() -> ctypes.CDLL:
    """libggml, for callers that set one of its process-wide hooks (engine/device_guard.py)."""
    return _ggml()


_load_lock = threading.Lock()
_loaded = False


def is_modular_build() -> bool:
    """True when the CPU backend is a loadable module (the portable build)."""
    return any(library_dir().glob(_shared_name("ggml-cpu-*")))


def load_backends() -> None:
    """Load the backend modules once (the fastest CPU variant for this CPU, RPC, a GPU
    backend if built). A build with linked-in backends already has its devices."""
    global _loaded
    with _load_lock:
        if _loaded:
            return
        lib = _ggml()
        if int(lib.ggml_backend_dev_count()) == 0 or is_modular_build():
            lib.ggml_backend_load_all_from_path(str(library_dir()).encode())
        _loaded = True
        if int(lib.ggml_backend_dev_count()) == 0:
            raise ModelError(
                "llama.cpp found no usable backend for this processor in "
                f"{library_dir()}; the installation is incomplete (run scripts/setup.sh)."
            )


@dataclass(frozen=True)
class Device:
    name: str  # llama.cpp's name: CPU, Vulkan0, CUDA0, RPC0, ...
    description: str
    kind: DeviceKind
    backend: str  # the backend that provides it: CPU, Vulkan, CUDA, RPC, ...
    free_bytes: int
    total_bytes: int
    handle: int = field(default=0, repr=False, compare=False)  # llama.cpp's device pointer

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("GPU", "iGPU")

    def label(self) -> str:
        return f"{self.name}: {self.description}" if self.description else self.name

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["handle"]
        return out


_KINDS: dict[int, DeviceKind] = {
    DEVICE_CPU: "CPU",
    DEVICE_GPU: "GPU",
    DEVICE_IGPU: "iGPU",
    DEVICE_ACCEL: "accelerator",
}


def _device(dev: int) -> Device:
    lib = _ggml()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    reg = lib.ggml_backend_dev_backend_reg(dev)
    return Device(
        name=(lib.ggml_backend_dev_name(dev) or b"").decode("utf-8", "replace"),
        description=(lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
        kind=_KINDS.get(int(lib.ggml_backend_dev_type(dev)), "other"),
        backend=(lib.ggml_backend_reg_name(reg) or b"").decode("utf-8", "replace") if reg else "",
        free_bytes=int(free.value),
        total_bytes=int(total.value),
        handle=int(dev),
    )


def devices(rpc_servers: tuple[str, ...] = ()) -> list[Device]:
    """The devices llama.cpp can use now, in its order. Device servers (RPC) stay registered
    for the whole process once added; only those named in `rpc_servers` are listed (asking
    a server that has gone away for its memory would abort the process)."""
    load_backends()
    lib = _ggml()
    found = []
    for i in range(int(lib.ggml_backend_dev_count())):
        dev = lib.ggml_backend_dev_get(i)
        reg = lib.ggml_backend_dev_backend_reg(dev)
        if reg and (lib.ggml_backend_reg_name(reg) or b"").startswith(b"RPC"):
            where = (lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace")
            if where not in rpc_servers:
                continue
        found.append(_device(dev))
    return found


def gpu_devices(rpc_servers: tuple[str, ...] = ()) -> list[Device]:
    """The GPUs llama.cpp offers, and the device servers named in `rpc_servers`."""
    return [d for d in devices(rpc_servers) if d.is_gpu]


def _proc(backend: str, symbol: str) -> int:
    load_backends()
    lib = _ggml()
    reg = lib.ggml_backend_reg_by_name(backend.encode())
    address = lib.ggml_backend_reg_get_proc_address(reg, symbol.encode()) if reg else None
    if not address:
        raise ModelError(
            f"This llama.cpp build has no {backend} backend ({symbol}); rebuild it with "
            "scripts/setup.sh."
        )
    return int(address)


def cpu_features() -> dict[str, str]:
    """The features the loaded CPU backend was compiled for (AVX2, AVX512, REPACK, ...)."""
    try:
        address = _proc("CPU", "ggml_backend_get_features")
    except ModelError:
        return {}
    get = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)(address)
    reg = _ggml().ggml_backend_reg_by_name(b"CPU")
    features: dict[str, str] = {}
    table = get(reg)
    index = 0
    while table[index].name:
        features[table[index].name.decode()] = (table[index].value or b"").decode()
        index += 1
    return features


def cpu_variant() -> str:
    """Which CPU module runs here (haswell, skylakex, zen4, ...): read from this process's
    mapped files, where the loader put the one it chose. 'built-in' for a linked-in CPU
    backend; 'unknown' where the platform does not say."""
    if not is_modular_build():
        return "built-in"
    with contextlib.suppress(OSError):
        maps = Path("/proc/self/maps").read_text("utf-8", "replace")
        found = re.search(r"libggml-cpu-([A-Za-z0-9_.]+?)\.so", maps)
        if found:
            return found.group(1)
    return "unknown"


def handles(chosen: list[Device]) -> list[int]:
    """llama.cpp's handles of these devices, for a model to load onto exactly them (none:
    the CPU alone). Without a list llama.cpp takes every device it knows, device servers
    another engine added included, and a context on a server that has gone away aborts the
    process. Every model this program loads is given one (engine/native.py)."""
    load_backends()
    return [d.handle for d in chosen]


# -- llama.cpp's RPC backend: a device served by another process ---------------------------


def check_endpoint(endpoint: str, allow_remote: bool = False) -> tuple[str, int]:
    """'host:port' -> (host, port). The RPC protocol has no authentication or encryption:
    only loopback addresses unless the caller allows others explicitly."""
    host, sep, port_text = endpoint.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InputError(
            f"'{endpoint}' is not a device address; write it as HOST:PORT, with a port from "
            "1 to 65535."
        )
    if not allow_remote:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise InputError(
                f"'{endpoint}' is not on this computer. llama.cpp's RPC protocol sends model "
                "weights and KV cache unencrypted and unauthenticated, so Galahad only uses "
                "devices served on 127.0.0.1."
            )
    return host, int(port_text)


_rpc_servers: dict[str, list[Device]] = {}  # registered once per process


def add_rpc_server(endpoint: str) -> list[Device]:
    """Make the devices an RPC server offers usable by models loaded from now on."""
    check_endpoint(endpoint)
    with _load_lock:
        if endpoint in _rpc_servers:
            return _rpc_servers[endpoint]
    # llama.cpp aborts the whole process when a server is not its own or goes silent: the
    # handshake is made here first, in Python, bounded by a timeout.
    probe_rpc_server(endpoint)
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
        _proc("RPC", "ggml_backend_rpc_add_server")
    )
    reg = add(endpoint.encode())
    lib = _ggml()
    found = [
        _device(lib.ggml_backend_reg_dev_get(reg, i))
        for i in range(int(lib.ggml_backend_reg_dev_count(reg)) if reg else 0)
    ]
    if not found:
        raise ModelError(f"The device server at {endpoint} did not answer.")
    with _load_lock:
        if endpoint not in _rpc_servers:
            lib.ggml_backend_register(reg)
            _rpc_servers[endpoint] = found
    return found


RPC_HELLO = 14  # llama.cpp's RPC_CMD_HELLO (fixed across protocol versions)
RPC_PROTO_MAJOR = 7  # the protocol of the pinned llama.cpp (ggml-rpc.h)
RPC_CAPS = 24  # RPC_CONN_CAPS_SIZE
PROBE_TIMEOUT_S = 3.0
# What `galahad serve-device` answers a handshake with while it serves another client, in
# place of the reply's size ("GLHDBUSY"): the probe says so by name, and llama.cpp's own
# client never gets that far (it connects only after the probe).
RPC_BUSY = int.from_bytes(b"GLHDBUSY", "little")
BUSY_GRACE_S = 1.0


def probe_rpc_server(endpoint: str, timeout_s: float | None = None) -> None:
    """Make llama.cpp's RPC handshake (HELLO) with a device server and check the answer;
    anything else is refused by name: nothing listening, a service that closes at once,
    stays silent, answers garbage or HTTP, or speaks another protocol version. Nothing of
    llama.cpp runs here, so no answer can abort the process."""
    host, port = check_endpoint(endpoint)
    if endpoint in _rpc_servers:
        return  # this process is connected already (a server serves one client at a time)
    timeout_s = PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    hint = f"start one with `galahad serve-device --port {port}`, or clear the rpc_servers setting"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(bytes([RPC_HELLO]) + struct.pack("<Q", RPC_CAPS) + bytes(RPC_CAPS))
            head = _recv_exact(sock, 8)
            (size,) = struct.unpack("<Q", head)
            if size == RPC_BUSY:
                raise ModelError(
                    f"The device server at {endpoint} is serving another program (it serves "
                    "one at a time); close that program, or start another server on another "
                    "port."
                )
            if size != 4 + RPC_CAPS:
                raise ModelError(
                    f"The service at {endpoint} is not llama.cpp's device server (it answered "
                    f"the handshake with {head[:4]!r}…); {hint}."
                )
            major, minor, patch = _recv_exact(sock, size)[:3]
    except TimeoutError:
        raise ModelError(
            f"The service at {endpoint} did not answer llama.cpp's handshake within "
            f"{timeout_s:.0f} s; {hint}."
        ) from None
    except ConnectionRefusedError:
        raise ModelError(f"No device server answers at {endpoint} ({hint}).") from None
    except OSError as exc:
        raise ModelError(
            f"The service at {endpoint} closed the connection during llama.cpp's handshake "
            f"({exc.strerror or type(exc).__name__}); {hint}."
        ) from None
    if major != RPC_PROTO_MAJOR:
        raise ModelError(
            f"The device server at {endpoint} speaks protocol {major}.{minor}.{patch}; this "
            f"Galahad speaks {RPC_PROTO_MAJOR}.x. Start it from this Galahad "
            "(galahad serve-device)."
        )


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise ConnectionResetError("closed")
        data += piece
    return data


def check_port_free(endpoint: str) -> None:
    """Refuse an address this process cannot listen on (llama.cpp only prints a line)."""
    host, port = check_endpoint(endpoint)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise InputError(f"Cannot serve on {endpoint}: {exc.strerror}.") from None


def serve_rpc_here(endpoint: str, n_threads: int) -> None:
    """Serve this machine's CPU device over llama.cpp's RPC protocol in this process;
    blocks (llama.cpp's loop never returns to Python, so only the device worker runs it)."""
    lib = _ggml()
    load_backends()
    cpu = lib.ggml_backend_reg_dev_get(lib.ggml_backend_reg_by_name(b"CPU"), 0)
    start = ctypes.CFUNCTYPE(
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    )(_proc("RPC", "ggml_backend_rpc_start_server"))
    served = (ctypes.c_void_p * 1)(cpu)
    start(endpoint.encode(), None, n_threads, 1, served)
    raise ModelError(f"llama.cpp stopped serving on {endpoint}.")  # it returns only on failure


def _device_worker(endpoint: str, n_threads: int) -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable, "--device-worker", endpoint, str(n_threads)]
    return [sys.executable, "-m", "galahad_desktop.engine.device_worker", endpoint, str(n_threads)]


def serve_rpc(endpoint: str, n_threads: int, on_ready: Callable[[], None] | None = None) -> None:
    """Serve this machine's CPU as an RPC device on `endpoint`, one client at a time, until
    Ctrl+C. llama.cpp's server runs in a child process on a private loopback port (its loop
    never returns to Python, so it could not be interrupted here); this process listens on
    `endpoint`, passes one client through, and answers any other with RPC_BUSY at once
    rather than leaving it hanging."""
    host, port = check_endpoint(endpoint)
    listener = listen(host, port, 8, f"Cannot serve on {endpoint}")
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        inner = ("127.0.0.1", int(spare.getsockname()[1]))
    # The worker's stdin stays open while this process lives: it exits when that ends.
    worker = subprocess.Popen(
        _device_worker(f"{inner[0]}:{inner[1]}", n_threads),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.getsignal(number) for number in stops}
    if threading.current_thread() is threading.main_thread():
        # Ctrl+C and `kill PID` stop it, even where it was started with SIGINT ignored (a
        # shell's background job, some CI runners): a server says Ctrl+C stops it.
        for number in stops:
            signal.signal(number, _stop_on_signal)
    try:
        _wait_listening(inner, worker)
        if on_ready is not None:
            on_ready()
        _gate(listener, inner, worker)
    except KeyboardInterrupt:
        pass  # Ctrl+C: stop serving
    finally:
        if threading.current_thread() is threading.main_thread():
            for number, handler in previous.items():
                signal.signal(number, handler)
        listener.close()
        worker.kill()
        worker.wait()


def _stop_on_signal(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _wait_listening(inner: tuple[str, int], worker: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise ModelError("llama.cpp's device server did not start (see the messages above).")
        try:
            socket.create_connection(inner, timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise ModelError("llama.cpp's device server did not start within 60 s.")


def _gate(listener: socket.socket, inner: tuple[str, int], worker: subprocess.Popen[bytes]) -> None:
    """Pass one client at a time through to the worker; answer the others RPC_BUSY (after
    a moment's grace: a program's probe is followed at once by llama.cpp's own connection,
    which must not find the probe's session still closing)."""
    free = threading.Event()
    free.set()
    while worker.poll() is None:
        conn, _address = listener.accept()
        if not free.wait(BUSY_GRACE_S):
            with contextlib.suppress(OSError):
                conn.sendall(struct.pack("<Q", RPC_BUSY))
            conn.close()
            continue
        try:
            upstream = socket.create_connection(inner, timeout=5)
        except OSError:
            conn.close()
            continue
        free.clear()
        threading.Thread(target=_pass_through, args=(conn, upstream, free), daemon=True).start()
    raise ModelError("llama.cpp's device server stopped.")


def _pass_through(client: socket.socket, upstream: socket.socket, free: threading.Event) -> None:
    """Copy bytes both ways until both sides are done (no delay: RPC is many small calls)."""
    for sock in (client, upstream):
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 16):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()
    free.set()


# -- where the model goes ---------------------------------------------------------------


@dataclass(frozen=True)
class OffloadPlan:
    gpu_layers: int  # layers placed on GPU devices (0: CPU only)
    total_layers: int  # the model's layers plus its output layer
    device: Device | None  # the first GPU device (where llama.cpp puts the KV of its layers)
    reason: str  # in words: why this many
    devices: tuple[Device, ...] = ()  # every GPU device the layers are split over


def plan_offload(
    requested: int,
    n_layers: int,
    model_bytes: int,
    kv_bytes: int,
    gpus: list[Device],
    overhead_bytes: int = 512 * 1024**2,
) -> OffloadPlan:
    """How many layers to offload. `requested` >= 0 is the user's number; -1 sizes the
    offload to the GPUs' free memory: weights and KV cache split evenly per layer, plus the
    compute buffers, never planning to fill the last 10%."""
    total = n_layers + 1  # llama.cpp counts the output layer as one more
    if not gpus:
        return OffloadPlan(0, total, None, "no GPU device: the CPU runs every layer")
    first = gpus[0]
    if requested >= 0:
        layers = min(requested, total) if n_layers > 0 else requested  # 0: not read yet
        return OffloadPlan(
            layers, total, first, f"{layers} layers, as set (n_gpu_layers)", tuple(gpus)
        )
    free = sum(d.free_bytes for d in gpus)
    per_layer = (model_bytes + kv_bytes) / total
    usable = free * 0.9 - overhead_bytes
    fit = total if per_layer <= 0 else max(0, min(total, int(usable // per_layer)))
    where = f"{free / GIB:.1f} GiB free on {', '.join(d.name for d in gpus)}"
    if fit == total:
        return OffloadPlan(total, total, first, f"all {total} layers fit ({where})", tuple(gpus))
    return OffloadPlan(
        fit,
        total,
        first,
        f"{fit} of {total} layers fit ({where}); the CPU runs the rest, which is slower",
        tuple(gpus),
    )


# -- how fast this machine reads and writes ----------------------------------------------


def measure_speed(
    model_path: Path, n_threads: int, prompt_tokens: int = 256
) -> tuple[float, float]:
    """(prompt tokens/s, generated tokens/s) of a model on this machine's devices: a
    few-second micro-benchmark (a prompt batch, then single-token steps; twice)."""
    gpus = gpu_devices()  # this machine's own GPUs, no device servers
    try:
        model = NativeModel(model_path, -1 if gpus else 0, handles(gpus))
    except ValueError as exc:
        raise ModelError(f"llama.cpp could not load {model_path}: {exc}") from None
    settings = ContextSettings(prompt_tokens + 64, prompt_tokens, prompt_tokens, n_threads)
    try:
        context = NativeContext(model, settings)
    except ValueError as exc:
        model.close()
        raise ModelError(f"llama.cpp could not load {model_path}: {exc}") from None
    try:
        text = b"The knights rode north along the river, counting the towers they passed. "
        tokens = model.tokenize(text * 40, add_bos=True, special=False)[:prompt_tokens]
        context.decode(tokens[:16], 0)  # warm-up: first-use allocations are not reading speed
        prefill = decode = 0.0
        steps = 16
        for _round in range(2):  # the better of two: a busy moment is not this machine's speed
            llama_cpp.llama_memory_clear(context.memory, True)
            start = time.perf_counter()
            context.decode(tokens, 0)
            prefill = max(prefill, len(tokens) / (time.perf_counter() - start))
            start = time.perf_counter()
            for offset, token in enumerate(tokens[:steps]):
                context.decode([token], len(tokens) + offset)
            decode = max(decode, steps / (time.perf_counter() - start))
        return prefill, decode
    finally:
        context.close()
        model.close()


def log_callback() -> Any:
    """The callback that keeps llama.cpp's messages off stderr (for mtmd, which has its own
    logger)."""
    return _llama_log
