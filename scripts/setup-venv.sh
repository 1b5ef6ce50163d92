#!/usr/bin/env bash
# `setup-venv.sh DIR REQUIREMENTS`: a Python virtual environment at DIR with REQUIREMENTS
# installed, made once and remade only when the requirements file changes. Prints its python.
# Used by setup-e2e.sh and setup-nvrtc.sh.
set -euo pipefail
venv="$1"
req="$2"
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$stamp"; then
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
    cp "$req" "$stamp"
fi
echo "$venv/bin/python"
