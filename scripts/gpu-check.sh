#!/usr/bin/env bash
# The GPU check: build llama-cpp-python==0.3.36 with CUDA into its own environment (.venv-gpu,
# the CPU .venv stays as it is), then run the self-test and `bench resume` on the GPU and keep
# the JSON (with its runtime fingerprint) in benchmarks/results/.
#
# Needs an NVIDIA GPU with its driver and the CUDA toolkit (nvcc) on PATH, and network access
# to PyPI (or PIP_FIND_LINKS pointing at downloaded wheels). Run it wherever such a GPU is:
#   scripts/gpu-check.sh [--sizes 1000,4000,16000] [--model path/to/gemma-4.gguf]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "gpu-check: no NVIDIA driver (nvidia-smi)" >&2; exit 2; }
command -v nvcc >/dev/null || { echo "gpu-check: no CUDA toolkit (nvcc) on PATH" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
PYTHON="${PYTHON:-python3}"
[ -x .venv-gpu/bin/python ] || "$PYTHON" -m venv .venv-gpu
export CMAKE_ARGS="-DGGML_CUDA=on" FORCE_CMAKE=1 CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
.venv-gpu/bin/python -m pip install -q --upgrade pip wheel
.venv-gpu/bin/python -m pip install -q --no-binary llama-cpp-python "llama-cpp-python==0.3.36"
.venv-gpu/bin/python -m pip install -q -e .
.venv-gpu/bin/python - <<'PY'
import llama_cpp, sys
if not llama_cpp.llama_supports_gpu_offload():
    sys.exit("gpu-check: llama-cpp-python was built without GPU offload")
print(llama_cpp.llama_print_system_info().decode())
PY
out=benchmarks/results/gpu
mkdir -p "$out"
stamp="$(date +%Y%m%d-%H%M%S)"
export QT_QPA_PLATFORM=offscreen
.venv-gpu/bin/galahad --self-test --json "$@" | tee "$out/self-test-$stamp.json"
.venv-gpu/bin/galahad bench resume --json --out "$out" "$@" > "$out/bench-resume-$stamp.json"
.venv-gpu/bin/galahad bench deposit --json --out "$out" "$@" > "$out/bench-deposit-$stamp.json"
echo "gpu-check: results in $out"
