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
python3 - "$OUT/ncu.csv" "${NCU_BATCH:-1}" >> "$OUT/profile.md" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
h = rows[hdr]; ki, ti = h.index('Kernel Name'), h.index('gpu__time_duration.sum')
data = [(r[ki], float(r[ti].replace(',', ''))) for r in rows[hdr + 2:] if len(r) > ti and r[ti]]
unit = rows[hdr + 1][ti]
emb = [i for i, (k, _) in enumerate(data) if k.startswith('embed_bf16')]
s0, s1 = emb[1], emb[-1]   # whole decode steps after the first (warm-up) one
steps = len(emb) - 2
agg = collections.defaultdict(lambda: [0, 0.0])
for k, t in data[s0:s1]:
    a = agg[k.split('(')[0][:60]]; a[0] += 1; a[1] += t
tot = sum(a[1] for a in agg.values())
print(f"\nncu, batch {sys.argv[2]}, context 1024: {steps} steps; kernels per step {sum(a[0] for a in agg.values())/steps:.0f}; summed kernel time per step {tot/steps/1e3:.3f} ({unit} / 1e3)\n")
print("| kernel | launches/step | time/step | share | mean per launch |")
print("| --- | ---: | ---: | ---: | ---: |")
for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| {k} | {n/steps:.0f} | {t/steps/1e3:.3f} | {100*t/tot:.1f}% | {t/n:.1f} |")
PY
tail -40 "$OUT/profile.md"; tail -3 "$OUT/ncu.err"
