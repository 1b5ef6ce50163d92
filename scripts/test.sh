#!/usr/bin/env bash
# The project's one test command (README, .ci/run): installs the end-to-end test client
# (the official `openai` Python package, into .venv-e2e), builds the workspace and runs every
# test, the HTTP suite against a live `weft serve` included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-e2e.sh >/dev/null
cargo test --workspace --locked
