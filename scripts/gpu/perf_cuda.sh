#!/usr/bin/env bash
# On the GPU machine, from the repository root, with the binaries built on a Rust machine in
# .device/ (cuda-kernels-test, cuda-step_graphs-test, weft, gpu_bench, roofline; scripts/gpu/build_device.sh): kernels against
# the CPU reference, then speed of the Moonlight-shaped and Kimi-K2-slice dummy models (decode
# and prefill against the GPU's measured ceilings), the large-batch-only paths
# (WEFT_CUDA_SLOW=1) for comparison, and `weft serve` under `weft bench serve` load. Logs go to
# $OUT, written as each step finishes (a run cut short keeps what it finished).
# STEPS picks parts (default: "kernels bench roofline serve"); SERVE_CONC the Moonlight sweep.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
STEPS=${STEPS:-kernels bench roofline serve}
SERVE_CONC=${SERVE_CONC:-1,8,32,64,128}
export WEFT_DEMO_MODEL=$PWD/models/demo
MOON=models/dummy/moonlight-16b-a3b; KIMI=models/dummy/kimi-k2-slice
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
if [[ " $STEPS " == *" kernels "* ]]; then
echo "== kernels and golden fixtures vs the CPU reference"
timeout 150 .device/cuda-kernels-test --test-threads 1 --nocapture > "$OUT/kernels.txt" 2>&1
timeout 150 .device/cuda-kernels_moe-test --test-threads 1 --nocapture >> "$OUT/kernels.txt" 2>&1
timeout 60 .device/cuda-step_graphs-test --nocapture >> "$OUT/kernels.txt" 2>&1
grep -E "rel err|dummy|test |SKIPPED|panicked|test result|sampling front" "$OUT/kernels.txt" | cut -c1-150
for b in cpu cuda; do .device/weft generate --backend $b --prompt "Love is" --max-tokens 60 --temperature 0 --ignore-eos --json > "$OUT/demo-$b.json" 2>/dev/null; done
python3 -c "
import json; a, b = (json.load(open('$OUT/demo-%s.json' % k)) for k in ('cpu', 'cuda'))
same = next((i for i, (x, y) in enumerate(zip(a['token_ids'], b['token_ids'])) if x != y), len(a['token_ids']))
print(f'demo greedy: {same}/{len(a[\"token_ids\"])} tokens identical before the first difference')" | tee -a "$OUT/kernels.txt"
fi
if [[ " $STEPS " == *" bench "* ]]; then
echo "== single stream through the reference generator (gpu_bench)"
{
timeout 60 .device/gpu_bench $MOON --dummy --prompt 1024 --gen 64
WEFT_CUDA_SLOW=1 timeout 60 .device/gpu_bench $MOON --dummy --prompt 1024 --gen 32 | tail -1 | sed 's/^| cuda/| cuda WEFT_CUDA_SLOW=1/'
timeout 60 .device/gpu_bench $KIMI --dummy --prompt 1024 --gen 64 | tail -1
} 2>&1 | tee "$OUT/bench.md"
fi
if [[ " $STEPS " == *" roofline "* ]]; then
echo "== roofline: Moonlight-shaped"
timeout 400 .device/roofline $MOON --dummy --batch 1,8,32,64,128 --ctx 1024,4096,32768 --prefill 1024,4096 2>&1 | tee "$OUT/roofline-moonlight.md"
echo "== roofline: Kimi-K2 slice (fp8)"
timeout 200 .device/roofline $KIMI --dummy --batch 1,8,64 --ctx 1024,4096 --prefill 1024 2>&1 | tee "$OUT/roofline-kimi.md"
fi
# weft serve + weft bench serve (random 1024-token prompts, 400 output tokens, ignore_eos).
serve_bench() { # model port concurrency-list waves timeout-seconds
    .device/weft serve --backend cuda --port "$2" --model "$1" --load-format dummy --kv-memory-fraction 0.8 --max-sequences 128 --token-budget 2048 > "$OUT/serve-$(basename "$1").log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$2/health" >/dev/null && break; sleep 0.5; done
    echo "command: weft bench serve --url http://127.0.0.1:$2 --input-len 1024 --output-len 400 --concurrency $3 --waves $4 --vocab-size 160000 --gpus 1 (greedy, the default)"
    timeout "$5" .device/weft bench serve --url "http://127.0.0.1:$2" --input-len 1024 --output-len 400 --concurrency "$3" --waves "$4" --vocab-size 160000 --gpus 1 --json "$OUT/serve-$(basename "$1").json" 2>&1
    kill -TERM $pid; wait $pid
    grep -E "ERROR|panicked" "$OUT/serve-$(basename "$1").log" | head -5
}
if [[ " $STEPS " == *" serve "* ]]; then
echo "== weft serve, Moonlight-shaped dummy (bf16)"
serve_bench $MOON 8011 "$SERVE_CONC" 1 360 | tee "$OUT/serve-moonlight.md"
echo "== weft serve, Kimi-K2 slice (fp8)"
serve_bench $KIMI 8012 1,8,32 1 150 | tee "$OUT/serve-kimi.md"
fi
