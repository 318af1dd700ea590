"""Runs on the user's machine: the CPU kernels llama.cpp chooses at run time, no AMX code
anywhere in what is installed, the offload plan, and (marked `gpu`) the device path: weights
and KV cells in a buffer that is not this process's memory, through llama.cpp's RPC backend
on 127.0.0.1 — states captured from the device and restored into it, every proof exact."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from galahad_desktop.engine import devices
from galahad_desktop.errors import InputError, ModelError
from galahad_desktop.memory.galahad import Galahad
from galahad_dev.redteam import FakeService
from tests.helpers import ROOT, cli_json, dev, story

GIB = 1024**3


# -- the offload plan and device addresses (no model) ------------------------------------


def _gpu(free_gib: float, name: str = "Vulkan0") -> devices.Device:
    return devices.Device(name, "Test GPU", "GPU", "Vulkan", int(free_gib * GIB), 24 * GIB)


def test_no_gpu_means_every_layer_on_the_cpu() -> None:
    plan = devices.plan_offload(-1, 18, 250_000_000, 10_000_000, [])
    assert plan.gpu_layers == 0 and plan.device is None and "no GPU" in plan.reason


def test_a_model_that_fits_is_offloaded_whole() -> None:
    plan = devices.plan_offload(-1, 42, 5_335_289_824, 1 * GIB, [_gpu(16)])
    assert plan.gpu_layers == plan.total_layers == 43 and "all 43 layers fit" in plan.reason


def test_a_model_too_big_offloads_what_fits_and_says_so() -> None:
    plan = devices.plan_offload(-1, 60, 18_700_000_000, 2 * GIB, [_gpu(8)])
    per_layer = (18_700_000_000 + 2 * GIB) / 61
    assert 0 < plan.gpu_layers < 61
    assert plan.gpu_layers * per_layer <= 8 * GIB * 0.9  # never planned past the headroom
    assert (plan.gpu_layers + 1) * per_layer > 8 * GIB * 0.9 - 512 * 1024**2
    assert f"{plan.gpu_layers} of 61 layers fit" in plan.reason and "slower" in plan.reason


def test_the_users_number_of_layers_wins() -> None:
    assert devices.plan_offload(0, 42, 1, 1, [_gpu(16)]).gpu_layers == 0
    assert devices.plan_offload(10, 42, 1, 1, [_gpu(16)]).gpu_layers == 10
    assert devices.plan_offload(999, 42, 1, 1, [_gpu(16)]).gpu_layers == 43


@pytest.mark.parametrize("endpoint", ["127.0.0.1:50052", "localhost:1", "[::1]:8080"])
def test_loopback_device_addresses_are_accepted(endpoint: str) -> None:
    assert devices.check_endpoint(endpoint)[1] > 0


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ("192.168.1.20:50052", "not on this computer"),
        ("gpu-box:50052", "not on this computer"),
        ("127.0.0.1", "HOST:PORT"),
        ("127.0.0.1:0", "HOST:PORT"),
        ("127.0.0.1:99999", "HOST:PORT"),
        (":50052", "HOST:PORT"),
    ],
)
def test_other_device_addresses_are_refused(endpoint: str, problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        devices.check_endpoint(endpoint)


def test_a_device_server_that_is_not_running_is_named_not_a_crash() -> None:
    port = _free_port()
    with pytest.raises(ModelError, match=f"No device server answers at 127.0.0.1:{port}"):
        devices.add_rpc_server(f"127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [
        ("close", "closed the connection"),
        ("stall", "did not answer llama.cpp's handshake within"),
        ("garbage", "is not llama.cpp's device server"),
        ("http", "is not llama.cpp's device server"),
        ("old", "speaks protocol 3.0.0"),
    ],
)
def test_a_service_that_is_not_a_device_server_is_refused_never_an_abort(
    behaviour: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "PROBE_TIMEOUT_S", 0.25)
    service = FakeService(behaviour)
    try:
        with pytest.raises(ModelError, match=said):
            devices.probe_rpc_server(service.endpoint, timeout_s=0.25)
        with pytest.raises(InputError, match="Not saved \\(rpc_servers\\)"):
            Galahad.check_settings({"rpc_servers": service.endpoint})
    finally:
        service.close()


@pytest.mark.parametrize("value", ["/etc/shadow", "/dev/zero", "/nonexistent/mmproj.gguf"])
def test_a_projector_that_is_not_a_gguf_is_refused_when_saved(value: str) -> None:
    with pytest.raises(InputError, match="Not saved \\(projector\\)"):
        Galahad.check_settings({"projector": value})


def _build_choice(tmp_path: Path, gpu: str | None, tools: tuple[str, ...]) -> tuple[int, str]:
    """What scripts/build-llama.sh would build, with stand-in GPU tools on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:  # nvidia-smi -L lists a GPU; nvcc exists
        (bin_dir / tool).write_text("#!/bin/sh\necho 'GPU 0: Stand-in GPU'\n")
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GALAHAD_GPU"}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", GALAHAD_BUILD_DRY_RUN="1")
    if gpu is not None:
        env["GALAHAD_GPU"] = gpu
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-llama.sh"), sys.executable],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_setup_builds_cuda_for_an_nvidia_gpu_with_its_toolkit(tmp_path: Path) -> None:
    code, said = _build_choice(tmp_path, None, ("nvidia-smi", "nvcc"))
    assert code == 0 and "GPU=cuda" in said and "-DGGML_CUDA=ON" in said
    assert "-DGGML_NATIVE=OFF" in said and "-DGGML_CPU_ALL_VARIANTS=ON" in said


def test_setup_says_why_it_builds_no_gpu_backend(tmp_path: Path) -> None:
    code, said = _build_choice(tmp_path, "cpu", ())
    assert code == 0 and "GPU=none" in said and "WHY=GALAHAD_GPU=cpu" in said
    assert "-DGGML_RPC=ON" in said and "VULKAN" not in said and "CUDA" not in said
    if not list(Path("/dev").glob("dri/renderD*")):
        code, said = _build_choice(tmp_path, None, ())
        assert code == 0 and "GPU=none" in said and "no GPU found" in said


@pytest.mark.parametrize(
    ("gpu", "problem"),
    [("cuda", "the CUDA toolkit (nvcc) is not on PATH"), ("metal", "must be auto, vulkan")],
)
def test_setup_refuses_a_gpu_backend_it_cannot_build(
    tmp_path: Path, gpu: str, problem: str
) -> None:
    code, said = _build_choice(tmp_path, gpu, ())
    assert code == 2 and problem in said


# -- the build that is installed (no model) ----------------------------------------------

AMX_MNEMONICS = re.compile(r"\b(ldtilecfg|sttilecfg|tilerelease|tilezero|tileloadd\w*|tdpb\w+)\b")


def _native_libraries() -> list[Path]:
    return sorted(p for p in devices.library_dir().iterdir() if ".so" in p.name and p.is_file())


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_no_installed_llama_cpp_library_holds_an_amx_instruction() -> None:
    """llama.cpp's AMX path segfaults on Xeons with AMX (upstream #20824): no installed
    library may contain one AMX instruction, whatever CPU built it."""
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) is needed to read the installed libraries"
    libraries = _native_libraries()
    assert any("ggml-cpu" in p.name for p in libraries)
    for library in libraries:
        listing = subprocess.run(
            [objdump, "-d", "--no-show-raw-insn", str(library)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found = AMX_MNEMONICS.search(listing)
        assert found is None, f"{library.name} holds the AMX instruction {found and found[0]}"


def test_the_build_is_portable_and_chose_kernels_for_this_cpu() -> None:
    assert devices.is_modular_build(), "llama.cpp was built for one CPU (run scripts/setup.sh)"
    variants = {p.name for p in devices.library_dir().glob("libggml-cpu-*.so")}
    assert {"libggml-cpu-x64.so", "libggml-cpu-haswell.so", "libggml-cpu-skylakex.so"} <= variants
    assert not any("sapphirerapids" in v for v in variants)
    devices.load_backends()
    features = {k for k, v in devices.cpu_features().items() if v == "1"}
    assert "AMX_INT8" not in features and "REPACK" in features
    flags = set(Path("/proc/cpuinfo").read_text().split())
    required = {
        "AVX": "avx",
        "AVX2": "avx2",
        "FMA": "fma",
        "F16C": "f16c",
        "AVX512": "avx512f",
        "AVX512_VNNI": "avx512_vnni",
        "AVX512_BF16": "avx512_bf16",
        "BMI2": "bmi2",
    }
    for feature, flag in required.items():
        if feature in features:
            assert flag in flags, f"the loaded kernels use {feature}, which this CPU lacks"
    if "avx2" in flags:  # the fastest variant that runs here, not the x86-64 baseline
        assert "AVX2" in features, devices.cpu_variant()
    assert devices.cpu_variant() not in ("x64", "built-in", "unknown")


@pytest.mark.model
@pytest.mark.parametrize(("cpu", "variant"), [("Haswell", "haswell"), ("Nehalem", "sse42")])
def test_an_older_cpu_loads_its_own_kernels_and_answers(
    cpu: str, variant: str, gemma3_path: Path
) -> None:
    """Emulated with qemu-user: an AVX2 laptop CPU (x86-64-v3) and an SSE4.2 one (v2) load
    the variant built for them and evaluate the embedded model; the build machine's
    AVX-512 is never needed."""
    code = (
        "from galahad_desktop.engine import devices; import llama_cpp, sys;"
        "devices.load_backends();"
        "llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, verbose=False);"
        "tokens = llm.tokenize(b'The castle stood on a hill above the river.');"
        "llm.eval(tokens);"
        "print(devices.cpu_variant(), len(tokens), flush=True)"
    )
    proc = subprocess.run(
        ["qemu-x86_64", "-cpu", cpu, sys.executable, "-c", code, str(gemma3_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    chosen, n_tokens = proc.stdout.split()
    assert chosen == variant and int(n_tokens) > 5


@pytest.mark.model
def test_this_machine_s_speed_is_measured_once_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from galahad_desktop.models import catalog

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("GALAHAD_FAKE_SPEED", raising=False)
    measured = catalog.measure_speed()
    assert measured.source == "measured"
    assert measured.prefill_tps > measured.decode_tps > 1.0  # a batch reads faster per token
    kept = catalog.measure_speed()
    assert kept.source == "cached" and kept.prefill_tps == measured.prefill_tps
    assert (tmp_path / "cache" / "galahad-desktop" / "speed.json").exists()
    rec = catalog.recommend(8192, catalog.Machine("CPU", "this CPU", 64 * GIB))
    assert rec.speed == kept
    e2b = rec.candidates[0]
    assert e2b.decode_tps == pytest.approx(kept.decode_tps * catalog.PROBE_ACTIVE_BILLIONS / 2.3)
    print(
        f"this machine: {measured.prefill_tps:.0f} tok/s reading, {measured.decode_tps:.1f} "
        f"tok/s replies (embedded model); recommended: {rec.recommended}"
    )


# -- the device path: llama.cpp's RPC backend on 127.0.0.1 --------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


REAL_GPU = os.environ.get("GALAHAD_TEST_DEVICE") == "gpu"  # scripts/gpu-check.sh


@pytest.fixture(scope="module")
def device_server() -> Iterator[str]:
    """A device served by another process (`galahad serve-device`): what is offloaded to it
    lives in that process's memory, reached only through llama.cpp's device copies. On a
    machine with a real GPU (scripts/gpu-check.sh) the GPU itself: no server."""
    if REAL_GPU:
        yield ""
        return
    port = _free_port()
    endpoint = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "galahad_desktop.cli",
            "serve-device",
            "--port",
            str(port),
            "--threads",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    said = proc.stderr.read() if proc.stderr else b""
                    raise AssertionError(f"the device server did not start: {said!r}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _on_device(core: Galahad) -> None:
    placement = core.engine.placement
    name = placement.device.split(":")[0]
    assert placement.gpu_layers == placement.total_layers > 1
    assert name != "CPU" and (REAL_GPU or name.startswith("RPC")), placement.device
    assert placement.kv_devices and "CPU" not in placement.kv_devices, placement.kv_buffers
    assert any(buffer.startswith(name) for buffer in placement.model_buffers)
    assert core.engine.fingerprint_details.device == placement.device


@pytest.mark.model
@pytest.mark.gpu
def test_deposit_chain_resume_regenerate_and_route_on_the_device(
    tmp_path: Path, make_core: Callable[..., Galahad], family: str, device_server: str
) -> None:
    first = make_core(rpc_servers=device_server, max_tokens=8)
    _on_device(first)
    doc = tmp_path / "notes.txt"
    doc.write_text(story(40))
    deposited = first.deposit(doc)
    conversation = first.new_conversation()
    for turn in range(2):
        first.send(conversation, f"Name a colour for day {turn}.")
    first.close()

    second = make_core(rpc_servers=device_server, max_tokens=8)  # a fresh context
    _on_device(second)
    report = second.resume(conversation)
    assert report.proof.verdict == "exact" and report.recomputed_tokens == 0
    assert second.engine.decoded_tokens == len(second.engine.probe_tokens)
    again = second.regenerate(conversation)  # from the turn's checkpoint, never a trim
    assert again.graft is not None and again.graft.proof.verdict == "exact"
    asked = second.new_conversation(document_id=deposited.document_id)
    answer = second.send(asked, "What is Arthur's access code?")
    assert answer.proof.verdict == "exact" and answer.counters.recomputed_tokens == 0
    assert answer.counters.restored_tokens == deposited.tokens
    routed = second.ask("What is Arthur's access code?")
    assert routed.answered, routed.decision.reason
    assert routed.graft is not None and routed.graft.recomputed_tokens == 0
    assert routed.graft.proof.verdict == "exact"
    second.close()


@pytest.mark.model
@pytest.mark.gpu
def test_a_block_from_the_cpu_is_re_read_on_the_device_never_grafted(
    tmp_path: Path, make_core: Callable[..., Galahad], device_server: str
) -> None:
    on_cpu = make_core(n_gpu_layers=0)  # the CPU alone, even where a GPU is present
    assert on_cpu.engine.placement.device == "CPU" and on_cpu.engine.placement.gpu_layers == 0
    assert on_cpu.engine.placement.kv_devices == ["CPU"]
    doc = tmp_path / "notes.txt"
    doc.write_text(story(30))
    deposited = on_cpu.deposit(doc)
    on_cpu.close()
    on_device = make_core(rpc_servers=device_server)
    conversation = on_device.new_conversation(document_id=deposited.document_id)
    report = on_device.resume(conversation)
    assert report.fallback_reason == "the model or its runtime settings changed"
    assert report.recomputed_tokens == deposited.tokens and report.restored_tokens == 0
    on_device.close()


@pytest.mark.model
@pytest.mark.gpu
def test_the_handshake_probe_accepts_llama_cpps_own_device_server(device_server: str) -> None:
    if not device_server:
        pytest.skip("a real GPU here: no device server to probe")
    devices.probe_rpc_server(device_server)  # no error: it speaks llama.cpp's protocol
    Galahad.check_settings({"rpc_servers": device_server})


@pytest.mark.model
@pytest.mark.gpu
def test_info_and_bench_name_the_device(tmp_path: Path, device_server: str) -> None:
    env = {
        "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
        "GALAHAD_PASSPHRASE": "correct horse battery",
    }
    info = cli_json(
        "--set",
        f"rpc_servers={device_server}",
        "info",
        "--passphrase",
        data_dir=tmp_path / "data",
        env=env,
    )
    placement = info["placement"]
    assert placement["device"] != "CPU" and placement["gpu_layers"] == 19
    assert (REAL_GPU or placement["device"].startswith("RPC0")) and placement["kv_devices"]
    assert "CPU" not in placement["kv_devices"]
    bench = dev(
        "--set",
        f"rpc_servers={device_server}",
        "bench",
        "resume",
        "--sizes",
        "200",
        "--reps",
        "1",
        tmp_path=tmp_path / "results",
        data_dir=tmp_path / "bench",
    )
    row = bench["results"][0]
    assert bench["placement"]["device"] == placement["device"]
    assert row["proof"] == "exact", row
    print(f"device bench: {row}")  # the figures, for the log (not a timed assertion)


def test_the_device_server_says_when_its_port_is_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "galahad_desktop.cli", "serve-device", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == InputError.exit_code
    assert f"Cannot serve on 127.0.0.1:{port}" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.model  # slow for the fast tier: it starts llama.cpp's device server
def test_the_device_server_serves_one_program_at_a_time_and_stops_on_ctrl_c() -> None:
    port = _free_port()
    endpoint = f"127.0.0.1:{port}"
    # Started as a shell's background job or some CI runners start it: SIGINT ignored on
    # entry (Python then installs no KeyboardInterrupt of its own). Ctrl+C must still stop it.
    proc = subprocess.Popen(
        [sys.executable, "-m", "galahad_desktop.cli", "serve-device", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                devices.probe_rpc_server(endpoint, timeout_s=1)
                break
            except ModelError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        # A first program holds the device (its handshake done, the connection open)...
        with socket.create_connection(("127.0.0.1", port), timeout=5) as first:
            first.sendall(
                bytes([devices.RPC_HELLO])
                + struct.pack("<Q", devices.RPC_CAPS)
                + bytes(devices.RPC_CAPS)
            )
            assert struct.unpack("<Q", first.recv(8))[0] == 4 + devices.RPC_CAPS
            # ...so a second is told at once, by name, instead of hanging.
            started = time.monotonic()
            with pytest.raises(ModelError, match="serving another program"):
                devices.probe_rpc_server(endpoint, timeout_s=2)
            assert time.monotonic() - started < 1.5
        deadline = time.monotonic() + 10
        while True:  # the first one left: the next is served
            try:
                devices.probe_rpc_server(endpoint, timeout_s=2)
                break
            except ModelError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        workers = _children(proc.pid)
        assert len(workers) == 1  # llama.cpp's server, in its device worker
        proc.send_signal(signal.SIGINT)  # after serving clients, Ctrl+C still stops it
        assert proc.wait(10) == 0
        assert "stopped serving" in (proc.stderr.read() if proc.stderr else "")
        _gone(workers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.model  # slow for the fast tier: it starts llama.cpp's device server
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_the_device_worker_never_outlives_serve_device(stop: signal.Signals) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "galahad_desktop.cli", "serve-device", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not _children(proc.pid) or not _answers(port):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        workers = _children(proc.pid)
        proc.send_signal(stop)
        proc.wait(10)
        _gone(workers)  # `kill` or `kill -9`: the worker goes with it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _answers(port: int) -> bool:
    try:
        devices.probe_rpc_server(f"127.0.0.1:{port}", timeout_s=1)
    except ModelError:
        return False
    return True


def _gone(pids: list[int], within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    for pid in pids:
        while Path(f"/proc/{pid}").exists():
            stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
            if stat.split(") ")[-1].startswith("Z"):
                break  # exited, not yet reaped by its (gone) parent's successor
            assert time.monotonic() < deadline, f"process {pid} outlived serve-device"
            time.sleep(0.05)


def test_the_device_server_refuses_other_addresses() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "galahad_desktop.cli", "serve-device", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert proc.returncode == InputError.exit_code and "not on this computer" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.model
@pytest.mark.gpu
def test_a_device_server_that_went_away_leaves_other_models_working(
    tmp_path: Path, gemma3_path: Path
) -> None:
    """Device servers stay registered for the process; a model loaded later for the CPU
    alone must not touch one that has gone away (llama.cpp would abort the process)."""
    port = _free_port()
    script = f"""
import subprocess, sys, time, socket
from pathlib import Path
from galahad_desktop.engine import devices
from galahad_desktop.engine.engine import Engine
from galahad_desktop.engine.values import EngineConfig
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
server = subprocess.Popen([sys.executable, "-m", "galahad_desktop.cli", "serve-device",
                           "--port", "{port}"], **quiet)
for _ in range(300):
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=1).close(); break
    except OSError:
        time.sleep(0.1)
devices.add_rpc_server("127.0.0.1:{port}")
server.kill(); server.wait()
engine = Engine(EngineConfig(model_path=Path(sys.argv[1]), n_ctx=512))
engine.evaluate(engine.bos() + engine.encode_text("Still here."))
print(engine.placement.device, len(engine.tokens))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script, str(gemma3_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    device, n_tokens = proc.stdout.split()
    assert device == "CPU" and int(n_tokens) > 2


# A conversation on a device server (`galahad serve-device`) that goes away: mid-reply (once
# the reply has evaluated 6 tokens) or while the chat idles between turns. The child process
# would abort (exit 134) where llama.cpp's RPC client is left to handle the loss.
_LOSS_CHILD = """
import json, socket, subprocess, sys, time
from pathlib import Path
from galahad_desktop.jobs import Job
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.vault.keys import MemoryKeyStore

data, port, model, when = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] or None, sys.argv[4]
server = subprocess.Popen(
    [sys.executable, "-m", "galahad_desktop.cli", "serve-device", "--port", str(port)],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
keys = MemoryKeyStore()
settings = {"n_ctx": 2048, "n_threads": 2, "temperature": 0.0, "max_tokens": 48}
core = Galahad(data, model_path=Path(model) if model else None, keystore=keys,
               overrides={**settings, "rpc_servers": f"127.0.0.1:{port}", "n_gpu_layers": -1})
first = core.send(None, "Hello! Say something short.")
placement = core.engine.placement.device
pieces = []

def on_pace(generated, _rate):
    if when == "mid-reply" and generated == 6:
        server.kill()
        server.wait()

if when == "idle":
    server.kill()
    server.wait()
    time.sleep(1.5)  # llama.cpp's dispatcher notices the closed connection by itself
cut = core.send(first.conversation_id, "Tell me a long story about a lighthouse.",
                Job(on_text=pieces.append, on_pace=on_pace))
after = core.engine.placement.device
third = core.send(first.conversation_id, "Thanks. One more sentence, please.")
stored = [m.text for m in core.messages(first.conversation_id)]
core.close()
again = Galahad(data, model_path=Path(model) if model else None, keystore=keys, overrides=settings)
resumed = again.resume(first.conversation_id)
print(json.dumps({
    "placement": placement, "after": after, "stop": cut.stop_reason, "notice": cut.notice,
    "streamed": "".join(pieces), "reply": cut.reply, "generated": cut.counters.generated_tokens,
    "third": third.reply, "stored": stored, "resumed": resumed.proof.verdict,
    "resumed_tokens": resumed.restored_tokens, "first_tokens": first.context_tokens,
    "cut_tokens": cut.context_tokens, "third_tokens": third.context_tokens,
}))
again.close()
"""


def _lose_the_device(tmp_path: Path, model: Path | None, when: str) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _LOSS_CHILD,
            str(tmp_path / "data"),
            str(_free_port()),
            str(model or ""),
            when,
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    assert result["placement"].startswith("RPC"), result
    assert result["after"] == "CPU", result  # loaded again without the server
    assert result["resumed"] == "exact", result
    # The whole conversation went on from where it was: nothing before the cut was dropped.
    assert result["first_tokens"] < result["cut_tokens"] < result["third_tokens"], result
    assert result["cut_tokens"] < result["resumed_tokens"] <= result["third_tokens"], result
    return result


@pytest.mark.model
@pytest.mark.gpu
def test_a_device_server_lost_mid_reply_keeps_what_was_streamed_and_goes_on_on_the_cpu(
    tmp_path: Path, family: str, family_model: Path | None
) -> None:
    result = _lose_the_device(tmp_path, family_model, "mid-reply")
    assert result["stop"] == "device_lost", result
    assert "went away" in result["notice"] and "127.0.0.1" in result["notice"]
    assert 1 <= result["generated"] <= 6, result  # the token that failed was never shown
    assert result["reply"] == result["streamed"], result  # what the user saw is what is kept
    assert result["stored"][3] == result["reply"]
    assert len(result["stored"]) == 6, result  # and the next turn ran on the CPU
    if family == "gemma3":
        assert result["streamed"].strip(), result  # (the Gemma 4 test model writes markup)


@pytest.mark.model
@pytest.mark.gpu
def test_a_device_server_lost_while_the_chat_idles_leaves_the_next_turn_to_the_cpu(
    tmp_path: Path,
) -> None:
    result = _lose_the_device(tmp_path, None, "idle")
    assert result["stop"] != "device_lost", result  # answered whole, on the CPU
    assert result["reply"].strip() and result["reply"] == result["streamed"], result
    assert len(result["stored"]) == 6, result


def _has_vulkan_backend() -> bool:
    return (devices.library_dir() / "libggml-vulkan.so").exists()


@pytest.mark.model
@pytest.mark.gpu
def test_a_vulkan_device_reads_once_and_resumes_exactly_in_a_new_process(tmp_path: Path) -> None:
    """The Vulkan backend on a real Vulkan device: Mesa's lavapipe (Vulkan 1.3 computing on
    the CPU; llama.cpp uses CPU-type Vulkan devices only when they are named). A document
    read in one process and asked about in another: every layer and the KV cache on
    Vulkan0, 0 tokens recomputed, the proof exact. Slow on two cores (a few tokens/s), so
    the document is small."""
    if not _has_vulkan_backend():
        message = "this build has no Vulkan backend (GALAHAD_GPU=vulkan builds it; CI does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    env = {
        "GGML_VK_VISIBLE_DEVICES": "0",
        "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
        "GALAHAD_PASSPHRASE": "correct horse battery",
    }
    data = tmp_path / "data"
    doc = tmp_path / "note.txt"
    doc.write_text("The access code of the vault is 4711. The vault is in the north tower.\n" * 4)
    small = ("--set", "n_ctx=1024")
    info = cli_json(*small, "info", "--passphrase", data_dir=data, env=env, timeout=900)
    placement = info["placement"]
    assert placement["backend"] == "Vulkan" and placement["device"].startswith("Vulkan0")
    assert placement["gpu_layers"] == placement["total_layers"] == 19
    assert placement["kv_devices"] == ["Vulkan0"]
    assert info["fingerprint_details"]["device"].startswith("Vulkan0")
    deposited = cli_json(*small, "deposit", str(doc), data_dir=data, env=env, timeout=900)
    asked = cli_json(
        *small,
        "ask",
        deposited["document_id"],
        "Where is the vault?",
        "--max-tokens",
        "2",
        data_dir=data,
        env=env,
        timeout=900,
    )
    assert asked["proof"] == "exact" and asked["recomputed_tokens"] == 0
    assert asked["restored_tokens"] == deposited["tokens"]
