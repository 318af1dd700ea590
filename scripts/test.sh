#!/usr/bin/env bash
# Set up everything, then run the whole test suite: lint, types, import contracts, pytest
# with the real models (the embedded Gemma 3 270M and the generated Gemma 4 test model), the
# real OS keyring (gnome-keyring in a private D-Bus session) and Qt offscreen; then the window
# tests again on a real X server (Xvfb) with a window manager.
# Arguments go to pytest (e.g. `scripts/test.sh -m "not model"` for the fast tier alone).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" PYTHON="$PWD/.venv/bin/python"
export QT_QPA_PLATFORM=offscreen PYTHONUNBUFFERED=1
ruff check galahad_desktop galahad_dev tests scripts
mypy
lint-imports --no-cache
run_pytest() {  # [--x] pytest arguments
  local under=()
  if [ "${1:-}" = "--x" ]; then under=(scripts/with-x.sh); shift; fi
  set +e
  scripts/with-keyring.sh "${under[@]}" python -m pytest "$@"
  local status=$?
  set -e
  if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests; that is a failure here." >&2
    return 1
  fi
  return "$status"
}
if compgen -G ".venv/lib/python3*/site-packages/llama_cpp/lib/libggml-vulkan.so" >/dev/null \
  && ! dpkg-query -W -f='${Status}' mesa-vulkan-drivers 2>/dev/null | grep -q "install ok installed"; then
  # The Vulkan backend's test needs a Vulkan device: Mesa's lavapipe computes on the CPU
  # (llama.cpp uses it only where a test names it, never by default).
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    mesa-vulkan-drivers >/dev/null
fi
if [ "$#" -gt 0 ]; then
  run_pytest "$@"
  exit
fi
# The whole suite in two parts, so both figures the project holds itself to are printed:
# the fast tier (limit 30 s on 2 cores) and the whole suite (limit 20 minutes).
started=$SECONDS
run_pytest -m "not model" -p no:cacheprovider
fast=$((SECONDS - started))
echo "test.sh: the fast tier took ${fast} s (limit 30 s)"
# The window's model tests run once, on the real X server below (the fast tier has already
# run its other tests offscreen).
window_tests=(tests/test_gui.py tests/test_ui_look.py tests/test_window_mcp.py)
run_pytest -m model -n 0 -p no:cacheprovider --durations=25 "${window_tests[@]/#/--ignore=}"
echo "test.sh: the window tests again, on a real X server with a window manager"
run_pytest --x -n 0 -p no:cacheprovider "${window_tests[@]}"
total=$((SECONDS - started))
echo "test.sh: the fast tier took ${fast} s (limit 30 s); the whole suite $((total / 60)) min $((total % 60)) s (limit 20 min)"
