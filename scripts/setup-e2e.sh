#!/usr/bin/env bash
# Installs what the end-to-end HTTP tests need (the official `openai` Python client, pytest,
# schemathesis) into .venv-e2e at the repository root. Idempotent: a venv whose requirements are unchanged
# is left as it is. Prints the venv's python path.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv-e2e"
req="$root/tests/e2e/requirements.txt"
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$stamp"; then
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
    cp "$req" "$stamp"
fi
echo "$venv/bin/python"
