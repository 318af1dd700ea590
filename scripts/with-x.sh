#!/usr/bin/env bash
# Run a command on a real X server (Xvfb) with a window manager (openbox), the way a desktop
# runs the app: focus, drag and drop and dialogs go through X and the window manager.
set -euo pipefail
if [ -n "${GALAHAD_X_READY:-}" ]; then exec "$@"; fi
exec xvfb-run -a -s "-screen 0 1600x1000x24" bash -c '
  openbox >/dev/null 2>&1 &
  for _ in $(seq 1 50); do xprop -root _NET_SUPPORTING_WM_CHECK >/dev/null 2>&1 && break; sleep 0.1; done
  export GALAHAD_X_READY=1 QT_QPA_PLATFORM=xcb
  "$@"' _ "$@"
