#!/usr/bin/env bash
# The project's one test command (README, .ci/run): installs the end-to-end test client
# (the official `openai` Python package, into .venv-e2e) and NVIDIA's runtime compiler (into
# .venv-nvrtc) and hipcc (Debian's ROCm packages, where it can) for the kernel compile tests,
# checks formatting (rustfmt.toml), builds the workspace and runs every test, the HTTP suite
# against a live `weft serve` included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-e2e.sh >/dev/null
nvrtc_lib=$(bash scripts/setup-nvrtc.sh)
export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" WEFT_REQUIRE_NVRTC=1
# hipcc from Debian's ROCm packages, when this machine lets us install it (root + apt):
# then the AMD kernel compile test is required too.
if [ -n "$(bash scripts/setup-hip.sh)" ]; then export WEFT_REQUIRE_HIPCC=1; fi
cargo fmt --all --check
cargo test --workspace --locked
