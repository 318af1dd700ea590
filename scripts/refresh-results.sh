#!/usr/bin/env bash
# Measure again and replace benchmarks/results/*.json (one file per benchmark; git keeps the
# history). Slow: about two hours on a 2-core CPU. Arguments name the ones to run
# (default: all), e.g. `scripts/refresh-results.sh bench-resume eval-tamper`.
set -euo pipefail
cd "$(dirname "$0")/.."
source .venv/bin/activate
out=benchmarks/results
declare -A commands=(
  [bench-resume]="python -m galahad_dev bench resume --sizes 1000,4000,16000 --reps 2"
  [bench-deposit]="python -m galahad_dev bench deposit --sizes 1000,4000,16000 --reps 1"
  [bench-kv-quality]="python -m galahad_dev bench kv-quality --sizes 4000 --window 256 --text benchmarks/routing/documents/gpl-3.txt"
  [bench-resume-image]="python -m galahad_dev --model MODEL --set n_ctx=4096 bench resume --image --reps 5"
  [bench-resume-audio]="python -m galahad_dev --model MODEL bench resume --audio --reps 5"
  [bench-persist]="python -m galahad_dev bench persist --sizes 1000,4000,16000 --turns 3"
  [eval-import]="python -m galahad_dev eval import --mutations 1000 --seed 0"
  [eval-destinations]="python -m galahad_dev eval destinations"
  [eval-tamper]="python -m galahad_dev eval tamper --mutations 1000 --seed 0"
  [eval-crashes]="python -m galahad_dev eval crashes --trials 30"
  [eval-hostile]="python -m galahad_dev eval hostile"
  [eval-needles]="python -m galahad_dev eval needles --blocks 64 --block-tokens 2000 --controls 16"
  [eval-memory]="python -m galahad_dev eval memory"
  [eval-routing]="python -m galahad_dev eval routing"
  [eval-routing-gemma4-test]="python -m galahad_dev --model MODEL --out OUT eval routing --documents dpkg-triggers.txt,gpl-3.txt,emacs-tutorial-ja.txt,man-db-manual.txt --ledgers 1"
  [eval-flywheel]="python -m galahad_dev eval flywheel --problems 30 --attempts 5"
  [ui-stall]="python -m galahad_dev.ui_stall --json"
  [ui-render]="python -m galahad_dev.ui_render --json"
  [bench-server]="python -m galahad_dev.server_ttft"
)
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=("${!commands[@]}")
for name in "${names[@]}"; do
  command=${commands[$name]:-}
  [[ -n $command ]] || { echo "refresh-results: unknown result '$name'" >&2; exit 2; }
  echo "== $name: $command"
  if [[ $name == ui-stall || $name == ui-render ]]; then
    $command > "$out/$name.json"
  elif [[ $name == bench-resume-image ]]; then
    # The Gemma 4 test model and its test projector (built beside it): the mechanics.
    model=$(python -c 'from galahad_desktop.paths import default_model_path as d
from galahad_dev import gemma4_model, gemma4_projector
m = gemma4_model.build(d()); gemma4_projector.build(out_dir=m.parent); print(m)')
    ${command/MODEL/$model}
  elif [[ $name == bench-resume-audio ]]; then
    # The Gemma 4 test model beside a test projector that also hears (as E2B's and E4B's).
    model=$(python -c 'import os, tempfile
from pathlib import Path
from galahad_desktop.paths import default_model_path as d
from galahad_dev import gemma4_model, gemma4_projector
m = gemma4_model.build(d()); folder = Path(tempfile.mkdtemp()); os.symlink(m, folder / m.name)
gemma4_projector.build(out_dir=folder, audio=gemma4_projector.AudioShape()); print(folder / m.name)')
    ${command/MODEL/$model}
  elif [[ $name == eval-routing-gemma4-test ]]; then
    # The Gemma 4 test model's mechanics: its own file, so eval-routing.json stays.
    model=$(python -c 'from galahad_desktop.paths import default_model_path as d
from galahad_dev.gemma4_model import build; print(build(d()))')
    tmp=$(mktemp -d)
    command=${command/MODEL/$model}
    ${command/OUT/$tmp}
    mv "$tmp/eval-routing.json" "$out/eval-routing-gemma4-test.json" && rmdir "$tmp"
  else
    $command
  fi
done
