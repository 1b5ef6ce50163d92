#!/usr/bin/env bash
# The project's one test command (README, .ci/run): installs the end-to-end test client
# (the official `openai` Python package, into .venv-e2e) and NVIDIA's runtime compiler (into
# .venv-nvrtc) and hipcc + the HIP runtime (Debian's ROCm packages, where it can) for the kernel
# compile tests and the HIP build,
# checks formatting (rustfmt.toml), builds the workspace and runs every test, the HTTP suite
# against a live `weft serve` included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-e2e.sh >/dev/null
nvrtc_lib=$(bash scripts/setup-nvrtc.sh)
export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" WEFT_REQUIRE_NVRTC=1
# hipcc from Debian's ROCm packages, when this machine lets us install it (root + apt):
# then the AMD kernel compile test is required too.
hip_sdk=
if [ -n "$(bash scripts/setup-hip.sh)" ]; then export WEFT_REQUIRE_HIPCC=1 hip_sdk=1; fi
cargo fmt --all --check
# The HIP (AMD) build of the GPU backend: its host logic over the mock HIP runtime, kernels on
# the CPU emulator with 64-lane wavefronts; then, where the HIP SDK was installed, built and
# linked against it (the real runtime must answer "no device" here, not crash).
cargo test -p weft-cuda --no-default-features --features hip-mock --locked --test hip_mock
if [ -n "$hip_sdk" ]; then cargo test -p weft-cuda --no-default-features --features hip --locked --test hip_sdk; fi
cargo test --workspace --locked
