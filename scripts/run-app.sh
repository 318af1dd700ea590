#!/usr/bin/env bash
# Set up everything, then start Galahad Desktop on the embedded default model (Gemma 3 270M).
# Without a display (a server, an SSH session) it starts the terminal chat instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] || [ "$(uname)" = "Darwin" ]; then
  exec .venv/bin/galahad gui "$@"
fi
echo "No display found: starting the terminal chat (galahad chat). Type /quit to leave." >&2
if [ -z "${DBUS_SESSION_BUS_ADDRESS:-}" ] && [ -z "${GALAHAD_DATA_DIR:-}" ]; then
  # No Secret Service on a headless login, so no place to keep a master key: run a demo
  # session with a throwaway keyring and a throwaway data directory, and say so.
  echo "No OS keyring here: this is a demo session and nothing is kept after it." >&2
  export GALAHAD_DATA_DIR="$(mktemp -d)/galahad"
  exec scripts/with-keyring.sh .venv/bin/galahad chat "$@"
fi
exec .venv/bin/galahad chat "$@"
