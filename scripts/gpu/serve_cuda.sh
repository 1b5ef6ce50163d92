#!/usr/bin/env bash
# On the GPU machine, from the repository root: `weft serve` on the CUDA backend (demo model and
# the Moonlight-shaped dummy model), one completion through curl, then `weft bench serve`.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
serve_and_bench() {  # model-args... ; uses port 8011
    .device/weft serve --backend cuda --port 8011 "$@" > "$OUT/serve.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 600); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
    head -1 "$OUT/serve.log"
    curl -s http://127.0.0.1:8011/v1/completions -H 'Content-Type: application/json' -d '{"prompt": "Love is", "max_tokens": 30, "seed": 3}'; echo
    .device/weft bench serve --url http://127.0.0.1:8011 --input-len ${IN:-1024} --output-len ${OUTLEN:-128} --concurrency ${CONC:-1,8,32} --num-prompts ${NP:-32} --vocab-size 2000
    kill -TERM $pid; wait $pid; echo "serve exit: $?"
}
echo "== demo model"; serve_and_bench
if [ "${MOON:-0}" = 1 ]; then echo "== Moonlight-shaped dummy"; serve_and_bench --model models/dummy/moonlight-16b-a3b --load-format dummy; fi
