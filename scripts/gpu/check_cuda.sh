#!/usr/bin/env bash
# Run on the GPU machine from the repository root, with the binaries built on a Rust machine
# in .device/ (made by scripts/gpu/build_device.sh: cuda-kernels-test and cuda-kernels_moe-test = the op test binaries,
# weft, gpu_bench, roofline).
# Writes its logs to $OUT (default: .device/out). MOON=0 skips the Moonlight-shaped dummy model
# (68 s to load); KIMI=1 adds the Kimi-K2 slice (~107 GB of bf16 weights).
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
echo "== kernels and golden fixtures vs the CPU reference"
.device/cuda-kernels-test --test-threads 1 --nocapture 2>&1 | tee "$OUT/kernels.txt" | grep -E "rel err|cuda|test |SKIPPED|panicked|result"
.device/cuda-kernels_moe-test --test-threads 1 --nocapture 2>&1 | tee -a "$OUT/kernels.txt" | grep -E "rel err|cuda|test |SKIPPED|panicked|result"
echo "== demo model, greedy, CPU vs CUDA"
for b in cpu cuda; do .device/weft generate --backend $b --prompt "Love is" --max-tokens 60 --temperature 0 --ignore-eos --json > "$OUT/demo-$b.json"; done
python3 - "$OUT" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/demo-{k}.json")) for k in ("cpu", "cuda"))
same = next((i for i, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])) if x != y), len(a["token_ids"]))
print(f"demo greedy: {same}/{len(a['token_ids'])} tokens identical before the first difference")
print("cpu :", repr(a["text"][:120])); print("cuda:", repr(b["text"][:120]))
PY
echo "== single-stream speed"
.device/gpu_bench models/demo --prompt 256 --gen 128 | tee "$OUT/bench.md"
if [ "${MOON:-1}" = 1 ]; then
    .device/gpu_bench models/dummy/moonlight-16b-a3b --dummy --prompt 1024 --gen 64 | tail -1 | tee -a "$OUT/bench.md"
fi
if [ "${KIMI:-0}" = 1 ]; then
    .device/gpu_bench models/dummy/kimi-k2-slice --dummy --prompt 256 --gen 16 | tail -1 | tee -a "$OUT/bench.md"
fi
