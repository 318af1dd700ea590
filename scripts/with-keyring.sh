#!/usr/bin/env bash
# Run a command inside a private D-Bus session with an unlocked gnome-keyring (Secret Service),
# for headless machines and CI. Uses a throwaway keyring directory so no real keys are touched.
set -euo pipefail
if [ -n "${GALAHAD_KEYRING_READY:-}" ]; then exec "$@"; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
[ -z "${PYTHON:-}" ] && [ -x "$here/.venv/bin/python" ] && PYTHON="$here/.venv/bin/python"
export XDG_DATA_HOME="${XDG_DATA_HOME_FOR_KEYRING:-$(mktemp -d)}"
export XDG_RUNTIME_DIR="$(mktemp -d)"; chmod 700 "$XDG_RUNTIME_DIR"
eval "$(dbus-launch --sh-syntax)"
trap 'kill "$DBUS_SESSION_BUS_PID" 2>/dev/null || true' EXIT
echo -n "galahad-ci-keyring" | gnome-keyring-daemon --unlock --components=secrets >/dev/null 2>&1 &
for _ in $(seq 1 50); do
  if "${PYTHON:-python3}" - <<'PY' 2>/dev/null
import secretstorage, sys
conn = secretstorage.dbus_init()
sys.exit(0 if secretstorage.get_default_collection(conn) else 1)
PY
  then break; fi
  sleep 0.2
done
export GALAHAD_KEYRING_READY=1
"$@"
