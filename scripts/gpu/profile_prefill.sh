#!/usr/bin/env bash
# On the GPU machine: where the time of a prefill goes. The roofline's prefill time (best of
# three, one sequence of PREFILL tokens), then the device time of each kernel of one prefill
# under Nsight Compute; the difference between the two is the time the GPU waits for the host.
# Output: $OUT/prefill.md, $OUT/ncu-prefill.csv.
set -uo pipefail
OUT=${OUT:-.device/out}; mkdir -p "$OUT"
export WEFT_DEMO_MODEL=$PWD/models/demo
MODEL=${MODEL:-models/dummy/moonlight-16b-a3b}
BIN=${BIN:-.device/roofline}
N=${PREFILL:-1024}
: > "$OUT/prefill.md"
timeout 200 $BIN $MODEL --dummy --batch 1 --ctx 16 --prefill $N --steps 2 2>&1 | tail -6 | tee -a "$OUT/prefill.md"
timeout ${NCU_TIMEOUT:-420} ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
  -k 'regex:^(?!dummy)' --launch-count ${COUNT:-4000} $BIN $MODEL --dummy --batch 1 --ctx 16 --prefill $N --steps 1 > "$OUT/ncu-prefill.csv" 2> "$OUT/ncu-prefill.err"
python3 - "$OUT/ncu-prefill.csv" >> "$OUT/prefill.md" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
h = rows[hdr]; ki, ti = h.index('Kernel Name'), h.index('gpu__time_duration.sum')
data = [(r[ki], float(r[ti].replace(',', ''))) for r in rows[hdr + 2:] if len(r) > ti and r[ti]]
unit = rows[hdr + 1][ti]
emb = [i for i, (k, _) in enumerate(data) if k.startswith('embed')] + [len(data)]
segs = [data[a:b] for a, b in zip(emb, emb[1:])]
seg = max(segs[:-1] or segs, key=lambda s: sum(t for _, t in s))
agg = collections.defaultdict(lambda: [0, 0.0])
for k, t in seg:
    a = agg[k.split('(')[0][:70]]; a[0] += 1; a[1] += t
tot = sum(a[1] for a in agg.values())
print(f"\nncu, one prefill: {len(seg)} kernels, summed kernel time {tot/1e3:.3f} ({unit} / 1e3); segments {[len(s) for s in segs]}\n")
print("| kernel | launches | time | share | mean per launch |")
print("| --- | ---: | ---: | ---: | ---: |")
for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| {k} | {n} | {t/1e3:.3f} | {100*t/tot:.1f}% | {t/n:.1f} |")
PY
tail -45 "$OUT/prefill.md"; tail -3 "$OUT/ncu-prefill.err"
