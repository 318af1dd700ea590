#!/usr/bin/env bash
# Build the self-contained Linux bundle: dist/galahad-desktop/ (one folder) and
# dist/galahad-desktop-linux-x86_64.tar.gz, with the .desktop file and icons, then run the
# frozen app's self-test (temporary data dir: load model, deposit, resume, exact proof).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
$PY -m pip install -q "pyinstaller>=6.10,<7"
$PY packaging/render_icons.py
export GALAHAD_MODEL_FILE="$($PY -c 'from galahad_desktop.paths import default_model_path as p; print(p())')"
rm -rf build/pyinstaller dist/galahad-desktop
$PY -m PyInstaller --noconfirm --clean --distpath dist --workpath build/pyinstaller \
  packaging/galahad-desktop.spec
bundle=dist/galahad-desktop
mkdir -p "$bundle/share/applications" "$bundle/share/icons/hicolor"
cp packaging/galahad-desktop.desktop "$bundle/share/applications/"
for png in assets/icons/galahad-*.png; do
  size="$(basename "$png" .png | sed 's/galahad-//')"
  mkdir -p "$bundle/share/icons/hicolor/${size}x${size}/apps"
  cp "$png" "$bundle/share/icons/hicolor/${size}x${size}/apps/galahad-desktop.png"
done
cp assets/galahad.svg "$bundle/share/icons/galahad-desktop.svg"
echo "build-linux: self-test of the frozen app"
QT_QPA_PLATFORM=offscreen "$bundle/galahad-desktop" --self-test --json
# The bundle's Vulkan backend, where it carries one, on a Vulkan device: Mesa's lavapipe
# (named, since llama.cpp skips CPU-type Vulkan devices otherwise) must hold every layer and
# the KV cache. Without lavapipe installed this check says so and is skipped.
if [ -f "$bundle/_internal/llama_cpp/lib/libggml-vulkan.so" ]; then
  if compgen -G "/usr/share/vulkan/icd.d/lvp_icd*.json" >/dev/null; then
    tmp_data="$(mktemp -d)"
    placement="$(GGML_VK_VISIBLE_DEVICES=0 PYTHON_KEYRING_BACKEND=keyring.backends.fail.Keyring \
      GALAHAD_PASSPHRASE="build-linux check" QT_QPA_PLATFORM=offscreen \
      "$bundle/galahad-desktop" --data-dir "$tmp_data/data" --set n_ctx=1024 --json info \
      --passphrase | "$PY" -c 'import json,sys; p=json.load(sys.stdin)["placement"]
print(p["device"], p["gpu_layers"], p["total_layers"], ",".join(p["kv_devices"]))')"
    rm -rf "$tmp_data"
    echo "build-linux: the frozen app on lavapipe: $placement"
    case "$placement" in
      Vulkan0*" 19 19 Vulkan0") ;;
      *) echo "build-linux: the bundle's Vulkan backend did not take the model" >&2; exit 1 ;;
    esac
  else
    echo "build-linux: no lavapipe (mesa-vulkan-drivers): the bundle's Vulkan backend not run"
  fi
fi
# Users' CPUs are not the build machine's: the same self-test on an emulated AVX2 laptop CPU
# (x86-64-v3, Intel Haswell) and an SSE4.2 one (x86-64-v2, Nehalem), with qemu-user. The
# frozen app must choose the CPU kernels built for them, never the build machine's AVX-512.
# qemu-user emulates only the process it starts, and PyInstaller's bootloader re-executes
# itself once to set its library path: the environment it would set is given up front, so
# the whole app runs emulated. (The document reader it starts as a child runs natively.)
app="$PWD/$bundle"
for cpu in ${GALAHAD_SELF_TEST_CPUS:-Haswell Nehalem}; do
  echo "build-linux: self-test of the frozen app under qemu-x86_64 -cpu $cpu"
  start=$SECONDS
  result="$(env LD_LIBRARY_PATH="$app/_internal" _PYI_ARCHIVE_FILE="$app/galahad-desktop" \
    _PYI_LINUX_PROCESS_NAME=galahad-desktop _PYI_PARENT_PROCESS_LEVEL=-1 \
    QT_QPA_PLATFORM=offscreen qemu-x86_64 -cpu "$cpu" "$app/galahad-desktop" --self-test --json \
    2> >(grep -v "TCG doesn't support requested feature" >&2))"
  echo "$result"
  variant="$(echo "$result" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["cpu_variant"])')"
  expected="$(echo "$cpu" | sed 's/Haswell/haswell/; s/Nehalem/sse42/')"
  if [ "$variant" != "$expected" ]; then
    echo "build-linux: under -cpu $cpu the app ran the '$variant' kernels, not '$expected'" >&2
    exit 1
  fi
  echo "build-linux: $cpu passed in $((SECONDS - start)) s ($variant kernels)"
done
tar -C dist -czf dist/galahad-desktop-linux-x86_64.tar.gz galahad-desktop
du -sh "$bundle" dist/galahad-desktop-linux-x86_64.tar.gz
