#!/usr/bin/env bash
# On the GPU machine: where the time of a batch-1 decode step goes. First the roofline's step
# time next to the host's enqueue time (a step whose enqueue takes as long as the step is bound
# by the host's launches, not by the GPU), then the device time of each kernel of the steady
# decode steps under Nsight Compute (one metric, clocks and caches left alone, so the kernels see
# the L2 state of a real step). BINS: roofline binaries to compare ("" for none); NCU_BATCH: the
# profiled batch size (1). Output: $OUT/profile.md, $OUT/ncu.csv.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
MOON=${MOON:-models/dummy/moonlight-16b-a3b}
BIN=${BIN:-.device/roofline}
: > "$OUT/profile.md"
for b in ${BINS-$BIN}; do
  echo "== $b" | tee -a "$OUT/profile.md"
  timeout 120 $b $MOON --dummy --batch 1,8,32 --ctx 1024 --prefill 1024 --steps 16 2>&1 | tee -a "$OUT/profile.md"
done
timeout 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
  -k 'regex:^(?!dummy)' --launch-count ${COUNT:-2600} $BIN $MOON --dummy --batch ${NCU_BATCH:-1} --ctx 1024 --prefill 16 --steps 2 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
python3 scripts/gpu/ncu_kernels.py decode "$OUT/ncu.csv" "${NCU_BATCH:-1}" >> "$OUT/profile.md"
tail -40 "$OUT/profile.md"; tail -3 "$OUT/ncu.err"
