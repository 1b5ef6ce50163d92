#!/usr/bin/env bash
# Installs what the end-to-end HTTP tests need (the official `openai` Python client, pytest,
# schemathesis) into .venv-e2e at the repository root. Idempotent: a venv whose requirements are unchanged
# is left as it is. Prints the venv's python path.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exec bash "$root/scripts/setup-venv.sh" "$root/.venv-e2e" "$root/tests/e2e/requirements.txt"
