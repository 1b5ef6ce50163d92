#!/usr/bin/env bash
# The reliability soak: starts `weft serve` (release build, CPU demo model unless WEFT_ARGS
# says otherwise) and runs tests/e2e/test_reliability.py for ROUNDS rounds (default 10) of plugin
# faults under load, 10x overload, slow readers and KV exhaustion with preemption, checking
# after every round that nothing was lost or leaked; prints the counts and the server's memory
# per round. Usage: scripts/soak.sh [ROUNDS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rounds="${1:-10}"
py="$(scripts/setup-e2e.sh)"
cargo build --release -p weft --bin weft >&2
port=$((20000 + RANDOM % 20000))
token="soak-$RANDOM$RANDOM"
# shellcheck disable=SC2086
target/release/weft serve --port "$port" --admin-token "$token" --num-pages 256 ${WEFT_ARGS:-} > "${TMPDIR:-/tmp}/weft-soak-$port.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
plugins="$(ls -d target/plugins/wasm32-wasip2/release)"
echo "{}" > "${TMPDIR:-/tmp}/weft-soak-refs.json"
WEFT_URL="http://127.0.0.1:$port" WEFT_ADMIN_TOKEN="$token" WEFT_MODEL="$(curl -s "http://127.0.0.1:$port/v1/models" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')" \
WEFT_PLUGIN_DIR="$root/$plugins" WEFT_GREEDY_REF="${TMPDIR:-/tmp}/weft-soak-refs.json" WEFT_SERVER_PID="$pid" WEFT_SOAK_ROUNDS="$rounds" \
    "$py" -m pytest -q -s -p no:cacheprovider tests/e2e/test_reliability.py
