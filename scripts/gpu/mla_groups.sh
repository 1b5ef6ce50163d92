#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/, and optionally the
# sm_90a PTX as .device/sm_90a.ptx from `WEFT_DUMP_PTX=DIR cargo test -p weft-cuda --test
# nvrtc_compile`): the MLA decode kernels' registers and spills, the kernel and step-graph
# tests, mla_bench over every head count and both caches (the picked kernel, mla_decode_mma,
# the opt-in one-query-part kernel), and Moonlight / the Kimi-K2 slice end to end over both
# caches. Output in $OUT.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
PTXAS=$(command -v ptxas || ls /usr/local/cuda*/bin/ptxas 2>/dev/null | head -1)
if [ -f .device/sm_90a.ptx ] && [ -n "$PTXAS" ]; then
    "$PTXAS" -arch=sm_90a -v .device/sm_90a.ptx -o /dev/null 2>&1 | grep -A3 "entry function 'mla_decode_mm" | grep -E "entry|Used|spill" | paste - - - | sed -E 's/ptxas info +: //g' > "$OUT/ptxas.txt"
    cut -c1-200 "$OUT/ptxas.txt"
fi
export WEFT_DEMO_MODEL=$PWD/models/demo
timeout 300 .device/cuda-kernels-test --test-threads 1 --nocapture > "$OUT/kernels.txt" 2>&1
timeout 100 .device/cuda-step_graphs-test --nocapture >> "$OUT/kernels.txt" 2>&1
grep -cE "rel err" "$OUT/kernels.txt"; grep -E "test result|panicked|FAILED" "$OUT/kernels.txt" | head
timeout 200 .device/mla_bench --batch 64 --ctx 4096 --queries 1,2 --heads 8,12,16,32,64,128 --kv f32,bf16 --mmg mla_decode_mmg4wq1_bf16 --reps 20 > "$OUT/mla_bench.md" 2>&1
timeout 60 .device/mla_bench --batch 1 --ctx 32768 --queries 1 --heads 16,64,128 --reps 20 | tail -n +4 >> "$OUT/mla_bench.md" 2>&1
grep -v "CUDA cores" "$OUT/mla_bench.md"
M=models/dummy/moonlight-16b-a3b; K=models/dummy/kimi-k2-slice
{
for kv in f32 bf16; do
    echo "== Moonlight, $kv cache"
    timeout 150 .device/roofline $M --dummy --batch 1,8,64,128 --ctx 1024,4096 --prefill 1024 --steps 8 --kv-cache-dtype $kv 2>&1 | grep -E "^\| [0-9]|GPU"
    echo "== Kimi slice, $kv cache"
    timeout 100 .device/roofline $K --dummy --batch 1,64 --ctx 1024,4096 --prefill 16 --steps 6 --kv-cache-dtype $kv 2>&1 | grep -E "^\| [0-9]"
done
echo "== Moonlight 64 x 32k, bf16 cache"
timeout 100 .device/roofline $M --dummy --batch 64 --ctx 32768 --prefill 16 --steps 4 --kv-cache-dtype bf16 2>&1 | grep -E "^\| [0-9]"
} > "$OUT/roofline.md" 2>&1
cat "$OUT/roofline.md"
