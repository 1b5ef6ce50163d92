#!/usr/bin/env bash
# On the GPU machine: the data of the side-by-side in results/roofline-h200.md. PART=weft: weft's
# end-to-end decode (roofline steps, generate path) and the device time of every kernel under
# Nsight Compute (Moonlight batch 1 and 64 at context 1024; the MLA kernels at 64 × 4096 and in a
# 1024-token prefill; the Kimi-K2 slice at batch 1 and 64). PART=torch: the PyTorch compositions
# of the same math and transformers' generate (scripts/gpu/torch_side_by_side.py). Output in
# $OUT; `python3 scripts/gpu/side_by_side_report.py DIR` turns it into the tables.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
M=models/dummy/moonlight-16b-a3b; K=models/dummy/kimi-k2-slice
ncu_csv() {  # ncu_csv NAME FILTER COUNT roofline-args...
  local name=$1 filter=$2 count=$3; shift 3
  timeout 240 ncu --clock-control none --cache-control none --csv --page raw \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size -k "$filter" --launch-count "$count" \
    .device/roofline "$@" > "$OUT/ncu/$name.csv" 2> "$OUT/ncu/$name.err"
  echo "ncu $name: rc=$? $(wc -l < "$OUT/ncu/$name.csv") lines"
}
if [ "${PART:-weft}" = weft ]; then
  mkdir -p "$OUT/ncu"
  {
    timeout 120 .device/roofline $M --dummy --batch 1,32,64 --ctx 1024 --prefill 1024 --steps 8 2>&1 | grep -E "^\| [0-9]|GPU|model"
    timeout 100 .device/gpu_bench $M --dummy --prompt 1024 --gen 32 2>&1 | tail -3
    timeout 120 .device/roofline $K --dummy --batch 1,64 --ctx 1024 --prefill 1024 --steps 6 2>&1 | grep -E "^\| [0-9]|GPU|model"
  } 2>&1 | tee "$OUT/weft_e2e.txt"
  ncu_csv moon_b1 'regex:^(?!dummy)' 2600 $M --dummy --batch 1 --ctx 1024 --prefill 16 --steps 2
  ncu_csv moon_b64 'regex:^(?!dummy)' 2600 $M --dummy --batch 64 --ctx 1024 --prefill 16 --steps 2
  ncu_csv mla 'regex:^mla' 2000 $M --dummy --batch 64 --ctx 4096 --prefill 1024 --steps 1
  ncu_csv kimi_b1 'regex:^(?!dummy)' 1500 $K --dummy --batch 1 --ctx 1024 --prefill 16 --steps 2
  ncu_csv kimi_b64 'regex:^(?!dummy)' 1500 $K --dummy --batch 64 --ctx 1024 --prefill 16 --steps 2
  tar -C "$OUT" -czf "$OUT/ncu.tar.gz" ncu && rm -rf "$OUT/ncu"
else
  timeout 300 python3 scripts/gpu/torch_side_by_side.py ops $M/config.json "$OUT" > "$OUT/torch.log" 2>&1; echo "ops rc=$?"
  timeout 280 python3 scripts/gpu/torch_side_by_side.py generate $M/config.json "$OUT" >> "$OUT/torch.log" 2>&1; echo "generate rc=$?"
  tail -60 "$OUT/torch.log"
fi
