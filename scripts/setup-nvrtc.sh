#!/usr/bin/env bash
# Installs NVRTC (NVIDIA's runtime compiler, from PyPI: no CUDA toolkit, no GPU needed) into
# .venv-nvrtc at the repository root, so the kernel compile test runs everywhere. Idempotent.
# Prints the directory holding libnvrtc.so.* (for LD_LIBRARY_PATH).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup-venv.sh" "$root/.venv-nvrtc" "$root/tests/nvrtc/requirements.txt" >/dev/null
lib=$(find "$root/.venv-nvrtc" -name 'libnvrtc.so.*' -not -name '*builtins*' | head -1)
[ -n "$lib" ] || { echo "libnvrtc not found in $root/.venv-nvrtc" >&2; exit 1; }
dirname "$lib"
