#!/usr/bin/env bash
# On the GPU machine: round 20's checks of the final binary and where a decode step's time goes
# over a bf16 cache — the MLA GPU tests (default, and the 64-head kernel for every head count),
# mla_bench at 64 × 4096 (default), then Nsight Compute device time per kernel of Moonlight's
# steady decode steps at batch 64 and 1, context 1024 (profile_decode.sh's method). PART picks
# (tests bench ncu). Output: $OUT/round18.md, $OUT/profile-b*.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
P=" ${PART:-tests bench ncu} "
[[ $P == *" tests "* || $P == *" bench "* ]] && SETS="WEFT_X=0 WEFT_X=1 WEFT_CUDA_MLA_WGMMA=3" PART="tests" \
    KTESTS="mla_ops_match_cpu mla_attention_head_counts" bash scripts/gpu/round18.sh 2>&1 | grep -v "rel err"
[[ $P == *" bench "* ]] && SETS="WEFT_X=1" PART=bench HEADS=${HEADS:-8,16,32,64,128} bash scripts/gpu/round18.sh 2>&1 | grep -v "rel err"
[[ $P == *" ncu "* ]] && for b in ${NCU_BATCHES:-64 1}; do
  timeout 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
    -k 'regex:^(?!dummy)' --launch-count ${COUNT:-2600} .device/roofline models/dummy/moonlight-16b-a3b --dummy --batch $b --ctx 1024 --prefill 16 --steps 2 --kv-cache-dtype bf16 > "$OUT/ncu-b$b.csv" 2> "$OUT/ncu-b$b.err"
  python3 scripts/gpu/ncu_kernels.py decode "$OUT/ncu-b$b.csv" $b > "$OUT/profile-b$b.md"
  echo "== ncu batch $b"; head -30 "$OUT/profile-b$b.md"; tail -2 "$OUT/ncu-b$b.err"
  rm -f "$OUT/ncu-b$b.csv"
done
true
