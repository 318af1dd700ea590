#!/usr/bin/env bash
# Set up everything, then run the whole test suite: lint, types, and pytest with the real
# model, the real OS keyring (gnome-keyring in a private D-Bus session) and Qt offscreen.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" PYTHON="$PWD/.venv/bin/python"
export QT_QPA_PLATFORM=offscreen PYTHONUNBUFFERED=1
ruff check galahad_desktop tests benchmarks
mypy
set +e
scripts/with-keyring.sh python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure here." >&2
  exit 1
fi
exit "$status"
