#!/usr/bin/env bash
# On the GPU machine (binaries from scripts/gpu/build_device.sh in .device/): round 25
# (results/roofline-h200.md) — MLA decode with two 64-token tiles a step in ping-pong between
# the warpgroups (mla_decode_wgp_bf16, kernels/mla_pair.cu; the default beyond 16 heads at
# DeepSeek's width) against round 24's split-token kernel (WEFT_CUDA_MLA_WGMMA=5), same binary.
# PART (space-separated): tests, bench, kimi, ncu — round24.sh's parts with this round's
# settings (tests under each of TSETS: the default, =6 — `_wgp_` for every head count — and
# =5; SETS alternated in bench, the first two in kimi and ncu); ncusrc — where the 64-head
# launch's warps wait, by SASS instruction (Nsight Compute's source page: the 40 instructions
# with the most stall samples, and the share of each opcode). Output: $OUT/round25.md.
set -uo pipefail
export OUT=${OUT:-.device/out}; mkdir -p "$OUT"
REPORT=round25 TSETS=${TSETS:-WEFT_X=1 WEFT_CUDA_MLA_WGMMA=6 WEFT_CUDA_MLA_WGMMA=5} SETS=${SETS:-WEFT_CUDA_MLA_WGMMA=5 WEFT_X=1 WEFT_CUDA_MLA_WGMMA=6} \
  bash "$(dirname "$0")/round24.sh"
R="$OUT/round25.md"
P=" ${PART:-tests bench kimi} "
[[ $P == *" ncusrc "* ]] && {
  echo "== ncu source, 64 x 4096, ${NCU_HEADS:-64} heads" | tee -a "$R"
  timeout 200 ncu --section WarpStateStats --section SourceCounters -k 'regex:mla_decode_wgp' --launch-skip 2 --launch-count 1 -f -o "$OUT/wgp" .device/mla_bench --batch 64 --ctx 4096 --queries 1 --heads ${NCU_HEADS:-64} --kv bf16 > /dev/null 2>&1
  ncu -i "$OUT/wgp.ncu-rep" --page source --csv --print-source sass 2> /dev/null > "$OUT/wgp_src.csv"
  python3 - "$OUT/wgp_src.csv" <<'PY' | tee -a "$R"
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
h = next(i for i, r in enumerate(rows) if any('Source' == c for c in r))
head, body = rows[h], rows[h + 1:]
col = next(i for i, c in enumerate(head) if c.startswith('Warp Stall Sampling (All'))
src = head.index('Source')
def n(x):
    try: return float(x.replace(',', ''))
    except ValueError: return 0.0
total = sum(n(r[col]) for r in body if len(r) > col)
print(f"stall samples {total:.0f}; columns: {head}")
kinds = collections.Counter()
for r in body:
    if len(r) > col: kinds[r[src].split()[0] if r[src].split() else '?'] += n(r[col])
print("by opcode:", ", ".join(f"{k} {v / total:.1%}" for k, v in kinds.most_common(15)))
for i, r in sorted(enumerate(body), key=lambda x: -n(x[1][col]) if len(x[1]) > col else 0)[:40]:
    print(f"{i:5d} {n(r[col]) / total:6.1%}  {r[src]}")
PY
}
true
