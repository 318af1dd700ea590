#!/usr/bin/env bash
# The GPU check, wherever a real GPU is (CI never has one: there the GPU tier runs on
# llama.cpp's RPC device instead). Builds llama.cpp with the machine's GPU backend into its
# own environment (.venv-gpu; the CPU .venv stays as it is) through the same build script as
# setup.sh, then runs the GPU tier of the tests on the real device (GALAHAD_TEST_DEVICE=gpu),
# the self-test, and `bench resume` / `bench deposit`, keeping the JSON (runtime fingerprint
# and placement included) in benchmarks/results/gpu/.
#
#   scripts/gpu-check.sh [--sizes 1000,4000,16000] [--model path/to/gemma-4.gguf]
#
# GALAHAD_GPU picks the backend (default: cuda with nvcc, else vulkan). Needs PyPI (or
# PIP_FIND_LINKS pointing at downloaded wheels) for the first build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GALAHAD_GPU:-}" ]; then
  if command -v nvcc >/dev/null; then export GALAHAD_GPU=cuda; else export GALAHAD_GPU=vulkan; fi
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
PYTHON="${PYTHON:-python3}"
[ -x .venv-gpu/bin/python ] || "$PYTHON" -m venv .venv-gpu
bash scripts/build-llama.sh .venv-gpu/bin/python
.venv-gpu/bin/python -m pip install -q -e ".[test]"
.venv-gpu/bin/python - <<'PY'
import sys
from galahad_desktop.engine import devices
gpus = devices.gpu_devices()
if not gpus:
    sys.exit("gpu-check: llama.cpp sees no GPU device with this build")
print("gpu-check: devices:", "; ".join(d.label() for d in gpus))
PY
out=benchmarks/results/gpu
mkdir -p "$out"
stamp="$(date +%Y%m%d-%H%M%S)"
export QT_QPA_PLATFORM=offscreen GALAHAD_TEST_DEVICE=gpu
.venv-gpu/bin/python -m pytest -m gpu -n 0 -p no:cacheprovider tests/test_hardware.py
.venv-gpu/bin/galahad --self-test --json "$@" | tee "$out/self-test-$stamp.json"
.venv-gpu/bin/python -m galahad_dev --json --out "$out/$stamp" "$@" bench resume > "$out/bench-resume-$stamp.json"
.venv-gpu/bin/python -m galahad_dev --json --out "$out/$stamp" "$@" bench deposit > "$out/bench-deposit-$stamp.json"
echo "gpu-check: results in $out"
