"""Per-kernel device times from an Nsight Compute CSV (`ncu --metrics gpu__time_duration.sum
--csv --page raw` of the roofline), summed by kernel name over forward steps, as a Markdown table.
Steps are cut at each `embed*` launch (a forward's first kernel).

  ncu_kernels.py decode CSV BATCH   the whole decode steps after the first (warm-up), per step
  ncu_kernels.py prefill CSV        the step with the most kernels (the prefill), whole
"""
import collections
import csv
import sys


def load(path):
    rows = list(csv.reader(open(path)))
    hdr = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
    h = rows[hdr]
    ki, ti = h.index('Kernel Name'), h.index('gpu__time_duration.sum')
    data = [(r[ki], float(r[ti].replace(',', ''))) for r in rows[hdr + 2:] if len(r) > ti and r[ti]]
    return data, rows[hdr + 1][ti]


def table(kernels, steps, width, per):
    agg = collections.defaultdict(lambda: [0, 0.0])
    for k, t in kernels:
        a = agg[k.split('(')[0][:width]]
        a[0] += 1
        a[1] += t
    tot = sum(a[1] for a in agg.values())
    print(f"| kernel | launches{per} | time{per} | share | mean per launch |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"| {k} | {n / steps:.0f} | {t / steps / 1e3:.3f} | {100 * t / tot:.1f}% | {t / n:.1f} |")


def main():
    mode, path = sys.argv[1], sys.argv[2]
    data, unit = load(path)
    if mode == 'decode':
        emb = [i for i, (k, _) in enumerate(data) if k.startswith('embed_bf16')]
        s0, s1 = emb[1], emb[-1]  # whole decode steps after the first (warm-up) one
        steps = len(emb) - 2
        kernels = data[s0:s1]
        n = len(kernels)
        tot = sum(t for _, t in kernels)
        print(f"\nncu, batch {sys.argv[3]}, context 1024: {steps} steps; kernels per step {n / steps:.0f}; summed kernel time per step {tot / steps / 1e3:.3f} ({unit} / 1e3)\n")
        table(kernels, steps, 60, "/step")
    else:
        # Steps end where the next begins; the last one is whole only if the launch count
        # reached past it, so the prefill is the longest step that has a successor.
        emb = [i for i, (k, _) in enumerate(data) if k.startswith('embed')] + [len(data)]
        segs = [data[a:b] for a, b in zip(emb, emb[1:])]
        seg = max(segs[:-1] or segs, key=len)
        if len(segs[-1]) > len(seg):
            print(f"\n(the last step, {len(segs[-1])} kernels, was cut by the launch count: raise COUNT to see the prefill whole)")
        tot = sum(t for _, t in seg)
        print(f"\nncu, one prefill: {len(seg)} kernels, summed kernel time {tot / 1e3:.3f} ({unit} / 1e3); kernels per step {[len(s) for s in segs]}\n")
        table(seg, 1, 70, "")


main()
