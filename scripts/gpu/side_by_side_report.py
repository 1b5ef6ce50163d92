#!/usr/bin/env python3
"""Tables of the side-by-side from what scripts/gpu/side_by_side.sh brought back.

    python3 scripts/gpu/side_by_side_report.py WEFT_DIR TORCH_DIR [NCU_DIR]

WEFT_DIR holds weft_e2e.txt and ncu.tar.gz (or NCU_DIR the unpacked CSVs), TORCH_DIR
torch_ops.json and transformers_generate.json. Per-op weft times are Nsight's kernel durations of
steady decode steps, split into the backend's ops (a new op starts at each op's first kernel:
norms, rope, cache store, MLA, MoE plan, a weight-streaming kernel, or the activation cast in
front of a cuBLAS GEMM) and averaged over the MoE layers.
"""
import collections, csv, io, json, os, re, sys, tarfile

# Kernels that continue the op in front of them (cuBLAS passes and reductions, epilogues).
CONTINUE = re.compile(r"^(nvjet|void cublasLt::splitKreduce|add_halves|silu_mul|mla_combine|moe_gate_up|moe_down|moe_combine|front_edits)")
# Backend ops of a MoE layer, in call order (runtime/model/src/graph.rs), without and with q LoRA.
MOE_OPS = ["add_rms_norm", "linear q_proj", "split_rope_q", "head_linear w_uk", "linear kv_a", "store_kv", "mla decode",
           "head_linear w_uv", "linear o_proj", "add_rms_norm", "router", "gated_up shared", "linear shared down", "moe experts"]
MOE_OPS_LORA = MOE_OPS[:1] + ["linear q_a", "rms_norm q_a", "linear q_b"] + MOE_OPS[2:]


def load(text):
    rows = list(csv.reader(io.StringIO(text)))
    hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    h = rows[hdr]
    ki, ti, gi = h.index("Kernel Name"), h.index("gpu__time_duration.sum"), h.index("launch__grid_size")
    return [(r[ki].split("(")[0], float(r[ti].replace(",", "")) / 1e3, int(r[gi].replace(",", ""))) for r in rows[hdr + 2:] if len(r) > ti and r[ti]]


def split_ops(kernels):
    ops, prev = [], None
    for k, t, _ in kernels:
        if ops and (CONTINUE.match(k) or prev == "cast_f32_bf16_split"):
            ops[-1][0].append(k)
            ops[-1][1] += t
        else:
            ops.append([[k], t])
        prev = k
    return ops


def layers(seq, norms_per_layer, batch):
    """Whole decode steps of `batch` rows (the embedding's grid), the first (warm-up) one left
    out, cut into layers at the norms."""
    emb = [i for i, (k, _, _) in enumerate(seq) if k.startswith("embed")] + [len(seq)]
    out = []
    for a, b in list(zip(emb, emb[1:]))[1:]:
        step = seq[a:b]
        if step[0][2] != batch or (b == len(seq) and not any(k.startswith("front_topk") for k, _, _ in step)):
            continue
        norms = [i for i, (k, _, _) in enumerate(step) if k in ("rms_norm", "add_rms_norm")]
        starts = norms[::norms_per_layer]
        out.append({"layers": [step[s:e] for s, e in zip(starts, starts[1:])], "tail": step[starts[-1]:], "head": step[:starts[0]],
                    "total": sum(t for _, t, _ in step)})
    return out


def per_layer(steps, names):
    """Mean µs per op over the MoE layers (1..) of all steps; ops whose count differs are flagged."""
    acc, n, bad = collections.defaultdict(float), 0, 0
    kernels = {}
    for s in steps:
        for layer in s["layers"][1:]:
            ops = split_ops(layer)
            if len(ops) != len(names):
                bad += 1
                continue
            n += 1
            for i, (ks, t) in enumerate(ops):
                acc[i] += t
                kernels[i] = ks
    return [(names[i], acc[i] / n, kernels[i]) for i in range(len(names))], n, bad


def torch_rows(tdir):
    ops = json.load(open(os.path.join(tdir, "torch_ops.json")))["rows"]
    best = {}
    for r in ops:
        name = r["op"]
        if name.startswith("moe experts"):
            name = "moe experts"
        key = (name, r["batch"], r["ctx"])
        if key not in best or r["us"] < best[key][0]:
            best[key] = (r["us"], r["op"])
    return best


def main():
    wdir, tdir = sys.argv[1], sys.argv[2]
    ncu = {}
    if len(sys.argv) > 3:
        for f in os.listdir(sys.argv[3]):
            if f.endswith(".csv"):
                ncu[f[:-4]] = open(os.path.join(sys.argv[3], f)).read()
    else:
        with tarfile.open(os.path.join(wdir, "ncu.tar.gz")) as t:
            for m in t.getmembers():
                if m.name.endswith(".csv"):
                    ncu[os.path.basename(m.name)[:-4]] = t.extractfile(m).read().decode()
    best = torch_rows(tdir)
    print("## weft kernels against the PyTorch composition (Moonlight MoE layer, context 1024)\n")
    for name, batch in (("moon_b1", 1), ("moon_b64", 64), ("moon_b64_cublas", 64)):
        if name not in ncu:
            continue
        steps = layers(load(ncu[name]), 2, batch)
        ops, n, bad = per_layer(steps, MOE_OPS)
        print(f"### {name}: batch {batch}, {len(steps)} steps, {n} MoE layers averaged ({bad} with another op count)\n")
        print("| op | weft kernels | weft µs | PyTorch µs | PyTorch composition | speed-up (PyTorch / weft) |")
        print("| --- | --- | ---: | ---: | --- | ---: |")
        merged = collections.OrderedDict()
        for op, us, ks in ops:
            m = merged.setdefault(op, [0.0, set(), 0])
            m[0] += us
            m[1].update(k[:28] for k in ks)
            m[2] += 1
        wsum = tsum = 0.0
        for op, (us, ks, count) in merged.items():
            key = "router" if op == "router" else op
            t = best.get((key, batch, 1024 if op == "mla decode" else 0))
            if op == "mla decode":
                t = best.get(("mla decode (matmul+softmax, f32 cache)", batch, 1024))
            tus = t[0] * count if t else None
            wsum += us
            tsum += tus or 0
            ratio = f"{tus / us:.2f}×" if tus else "—"
            print(f"| {op}{' ×%d' % count if count > 1 else ''} | {', '.join(sorted(ks))} | {us:.1f} | {'%.1f' % tus if tus else '—'} | {t[1] if t else 'not measured'} | {ratio} |")
        print(f"| **layer** | | **{wsum:.1f}** | **{tsum:.1f}** (ops measured) | | |\n")
        tail = steps[-1]["tail"]
        print(f"step kernel time {sum(s['total'] for s in steps) / len(steps) / 1e3:.3f} ms; after the last layer: "
              + ", ".join(f"{k[:24]} {t:.1f}" for k, t, _ in tail) + " µs\n")
    # MLA at 64 × 4096 and in the 1024-token prefill
    if "mla" in ncu:
        seq = load(ncu["mla"])
        dec = [t for k, t, _ in seq if k == "mla_decode"]
        comb = [t for k, t, _ in seq if k == "mla_combine"]
        print("### MLA kernels (batch 64 × 4096 decode; 1024-token prefill)\n")
        print(f"decode launches {len(dec)}: first layers' mla_decode {sum(dec[:27]) / 27:.1f} µs + mla_combine {sum(comb[:27]) / 27:.1f} µs; "
              f"last 27 (prefill) mla_decode {sum(dec[-27:]) / 27:.1f} + mla_combine {sum(comb[-27:]) / 27:.1f} µs\n")
    # Kimi slice layers
    for name, batch in (("kimi_b1", 1), ("kimi_b64", 64)):
        if name not in ncu:
            continue
        s = layers(load(ncu[name]), 3, batch)[-1]
        tot = [sum(t for _, t, _ in l) for l in s["layers"]]
        print(f"{name}: step kernel time {s['total'] / 1e3:.3f} ms; layer 0 (dense) {tot[0]:.1f} µs; MoE layers {', '.join('%.1f' % x for x in tot[1:])} µs; "
              f"embed {sum(t for _, t, _ in s['head']):.1f}; final norm + lm_head + front end {sum(t for _, t, _ in s['tail']):.1f} µs")
    print()
    gen = json.load(open(os.path.join(tdir, "transformers_generate.json")))
    print("### transformers generate\n")
    for r in gen["runs"]:
        print(f"- experts={r['experts']} attn={r['attn']} batch {r['batch']}: {r['decode_ms_per_step']} ms/step, {r['decode_tok_s']} tok/s, prefill {r['prefill_s']} s")


if __name__ == "__main__":
    main()
