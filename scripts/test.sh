#!/usr/bin/env bash
# The project's one test command (README, .ci/run): builds the workspace and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
