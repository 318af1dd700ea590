#!/usr/bin/env bash
# Build llama-cpp-python==0.3.36 (llama.cpp) into the given Python environment, for the
# machines Galahad runs on rather than the one that builds it. Called by setup.sh.
#
# - CPU: never tuned to the build machine (-march=native made a bundle that died with an
#   illegal instruction on every CPU without AVX-512). Every backend is a module, and the CPU
#   backend is built once per x86-64 level (x86-64, SSE4.2, AVX, AVX2, AVX-512 and its
#   VNNI/BF16 kinds); llama.cpp loads the fastest one this CPU runs (engine/devices.py).
# - No AMX: llama.cpp's AMX kernels segfault on Intel Xeons with AMX (upstream #20824). The
#   only variant compiled with AMX (sapphirerapids) is not installed; those CPUs run the
#   AVX-512 VNNI/BF16 variant with the repacked kernels. tests/test_hardware.py checks that no
#   installed library holds an AMX instruction.
# - RPC: llama.cpp's device-over-a-socket backend (a model across machines, and the device
#   path CI tests without a GPU: engine/devices.py, `galahad serve-device`).
# - GPU, chosen here and said out loud; GALAHAD_GPU=auto|vulkan|cuda|cpu overrides:
#     cuda    an NVIDIA GPU with the CUDA toolkit (nvcc) on PATH: llama.cpp's fastest there;
#     vulkan  any other GPU (NVIDIA, AMD, Intel) with its normal driver; needs Vulkan headers
#             with VK_EXT_layer_settings (1.3.261+: Debian 13, Ubuntu 24.04; Debian 12's
#             1.3.239 are too old), glslc and SPIRV headers;
#     cpu     no GPU backend.
#   macOS keeps llama-cpp-python's own build (Metal on Apple silicon).
# The wheel is kept per build configuration under ~/.cache/galahad/llama-wheels, so a fresh
# checkout on the same machine installs it in seconds (GALAHAD_LLAMA_WHEEL=FILE supplies one
# built elsewhere with the same configuration).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
VERSION=0.3.36
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

apt_install() {  # packages...
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  command -v apt-get >/dev/null || return 1
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
}

VULKAN_ROOT=""  # where newer Vulkan and SPIR-V headers were unpacked, when the system's are old

vulkan_headers_ok() {  # include dir
  grep -qs "VK_EXT_layer_settings" "$1/vulkan/vulkan_core.h"
}

vulkan_headers_version() {  # include dir
  local header="$1/vulkan/vulkan_core.h" minor patch
  minor="$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, \([0-9]*\), \([0-9]*\),.*/\1.\2/p' "$header" 2>/dev/null | head -n 1)"
  patch="$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$header" 2>/dev/null | head -n 1)"
  [ -n "$minor" ] && echo "$minor.$patch"
}

debian_mirror() {  # the URI of the Debian archive in this system's apt sources
  local uri=""
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
    uri="$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}' \
      /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)"
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri="$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' \
      /etc/apt/sources.list | head -n 1)"
  fi
  echo "$uri"  # empty: apt names no archive here, and no host of our choosing stands in
}

newer_vulkan_headers() {
  # Debian 12's Vulkan headers (1.3.239) predate VK_EXT_layer_settings. Debian 13's header
  # packages are fetched with apt into a private folder (the system's apt sources and
  # packages stay as they are); llama.cpp compiles against them and links the system's
  # Vulkan loader, which accepts newer headers' structures.
  local root="${XDG_CACHE_HOME:-$HOME/.cache}/galahad/vulkan-headers"
  if ! vulkan_headers_ok "$root/usr/include"; then
    command -v apt-get >/dev/null || return 1
    local tmp o mirror
    mirror="$(debian_mirror)"
    [ -n "$mirror" ] || return 1
    tmp="$(mktemp -d)"
    mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/debs"
    # The mirror this system's apt already uses (a company mirror, a proxy), with Debian
    # 13's suite: never a host of our choosing.
    echo "deb $mirror trixie main" > "$tmp/sources.list"
    o=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
       -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o "APT::Sandbox::User=root")
    echo "setup: fetching Debian 13's Vulkan and SPIR-V headers into $root"
    apt-get "${o[@]}" update -qq >/dev/null 2>&1 \
      && (cd "$tmp/debs" && apt-get "${o[@]}" download -qq libvulkan-dev spirv-headers >/dev/null 2>&1) \
      || { rm -rf "$tmp"; return 1; }
    rm -rf "$root" && mkdir -p "$root"
    for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
    rm -rf "$tmp"
  fi
  vulkan_headers_ok "$root/usr/include" && VULKAN_ROOT="$root"
}

choose_gpu() {  # sets GPU and WHY
  local choice="${GALAHAD_GPU:-auto}"
  local nvidia="" render=""
  command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && nvidia="yes"
  compgen -G "/dev/dri/renderD*" >/dev/null && render="yes"
  case "$choice" in
    cpu) GPU=none; WHY="GALAHAD_GPU=cpu"; return ;;
    cuda)
      command -v nvcc >/dev/null || { echo "setup: GALAHAD_GPU=cuda, but the CUDA toolkit (nvcc) is not on PATH" >&2; exit 2; }
      GPU=cuda; WHY="GALAHAD_GPU=cuda"; return ;;
    vulkan|auto) ;;
    *) echo "setup: GALAHAD_GPU must be auto, vulkan, cuda or cpu (it is '$choice')" >&2; exit 2 ;;
  esac
  if [ "$choice" = auto ] && [ -n "$nvidia" ] && command -v nvcc >/dev/null; then
    GPU=cuda; WHY="an NVIDIA GPU and the CUDA toolkit"; return
  fi
  if [ "$choice" = auto ] && [ -z "$nvidia$render" ]; then
    GPU=none; WHY="no GPU found (no NVIDIA driver, no /dev/dri render node)"; return
  fi
  apt_install libvulkan-dev libvulkan1 glslc spirv-headers || true
  if ! vulkan_headers_ok /usr/include || ! [ -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ]; then
    newer_vulkan_headers || true
  fi
  local include="${VULKAN_ROOT:-}/usr/include"
  if ! command -v glslc >/dev/null || ! vulkan_headers_ok "$include"; then
    WHY="a GPU is here, but no Vulkan headers with VK_EXT_layer_settings (1.3.261 or newer) could be had"
    command -v glslc >/dev/null || WHY="a GPU is here, but the shader compiler glslc is missing"
    [ -n "$nvidia" ] && WHY="$WHY; with the CUDA toolkit, GALAHAD_GPU=cuda builds for NVIDIA"
    if [ "$choice" = vulkan ]; then echo "setup: GALAHAD_GPU=vulkan: $WHY" >&2; exit 2; fi
    GPU=none; return
  fi
  GPU=vulkan
  WHY="a GPU was found"
  [ "$choice" = vulkan ] && WHY="GALAHAD_GPU=vulkan"
  WHY="$WHY; Vulkan headers $(vulkan_headers_version "$include")"
  [ -n "$VULKAN_ROOT" ] && WHY="$WHY (Debian 13's, unpacked privately)"
}

if [ "$(uname)" = "Darwin" ]; then
  GPU=metal; WHY="macOS: llama-cpp-python's own build"
  CMAKE_FLAGS=""
else
  choose_gpu
  CMAKE_FLAGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_RPC=ON"
  case "$GPU" in
    cuda) CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_CUDA=ON" ;;
    vulkan)
      CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_VULKAN=ON"
      if [ -n "$VULKAN_ROOT" ]; then
        loader="$(ls /usr/lib/*-linux-gnu/libvulkan.so.1 2>/dev/null | head -n 1)"
        CMAKE_FLAGS="$CMAKE_FLAGS -DVulkan_INCLUDE_DIR=$VULKAN_ROOT/usr/include"
        CMAKE_FLAGS="$CMAKE_FLAGS -DVulkan_LIBRARY=$loader"
        CMAKE_FLAGS="$CMAKE_FLAGS -DSPIRV-Headers_DIR=$VULKAN_ROOT/usr/share/cmake/SPIRV-Headers"
      fi ;;
  esac
fi

if [ -n "${GALAHAD_BUILD_DRY_RUN:-}" ]; then  # say what would be built, build nothing
  printf 'GPU=%s\nWHY=%s\nCMAKE_FLAGS=%s\n' "$GPU" "$WHY" "$CMAKE_FLAGS"
  exit 0
fi
config="llama-cpp-python==$VERSION $CMAKE_FLAGS"
stamp="$(dirname "$PY")/../.galahad-llama-build"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$config" ]; then
  exit 0
fi
echo "setup: llama.cpp for this machine: CPU kernels for every x86-64 level (chosen at run time), RPC, GPU: $GPU ($WHY)"
"$PY" -m pip install -q --upgrade pip wheel
key="$(echo "$config" | sha256sum | cut -c1-16)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/galahad/llama-wheels/$key"
wheel="$(ls "$cache"/llama_cpp_python-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$wheel" ] && [ -n "${GALAHAD_LLAMA_WHEEL:-}" ]; then
  # A wheel built elsewhere with this same configuration (a build machine, an earlier try).
  mkdir -p "$cache" && cp "$GALAHAD_LLAMA_WHEEL" "$cache/"
  wheel="$(ls "$cache"/llama_cpp_python-*.whl | head -n 1)"
fi
if [ -z "$wheel" ]; then
  echo "setup: compiling llama.cpp (about 15 minutes on 2 cores the first time; kept for later)"
  tmp="$(mktemp -d)"
  CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$PY" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -w "$tmp"
  mkdir -p "$cache"
  mv "$tmp"/llama_cpp_python-*.whl "$cache/"
  rm -rf "$tmp"
  wheel="$(ls "$cache"/llama_cpp_python-*.whl | head -n 1)"
fi
"$PY" -m pip install -q --force-reinstall --no-deps "$wheel"
"$PY" -m pip install -q "numpy>=1.26" "typing-extensions>=4.5" "diskcache>=5.6.1" "jinja2>=2.11.3"
"$PY" - <<'PY'
# Put every backend module beside libllama (where the engine and the frozen bundle look),
# and leave out the one variant built with AMX kernels.
import pathlib, shutil, sysconfig
site = pathlib.Path(sysconfig.get_paths()["platlib"])
lib = site / "llama_cpp" / "lib"
for stray in [*(site / "bin").glob("libggml-*.so"), *(site / "lib").glob("libggml-*.so")]:
    if (lib / stray.name).exists():
        stray.unlink()  # the same file, installed twice
    else:
        shutil.move(str(stray), lib / stray.name)
for amx in lib.glob("libggml-cpu-sapphirerapids*"):
    amx.unlink()
modules = sorted(p.name for p in lib.glob("libggml-*.so"))
print("setup: llama.cpp backend modules:", " ".join(modules))
PY
echo "$config" > "$stamp"
