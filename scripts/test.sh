#!/usr/bin/env bash
# The project's one test command (README, .ci/run): installs the end-to-end test client
# (the official `openai` Python package, into .venv-e2e) and NVIDIA's runtime compiler (into
# .venv-nvrtc, for the kernel compile test), builds the workspace and runs every test, the HTTP
# suite against a live `weft serve` included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-e2e.sh >/dev/null
nvrtc_lib=$(bash scripts/setup-nvrtc.sh)
export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" WEFT_REQUIRE_NVRTC=1
cargo test --workspace --locked
