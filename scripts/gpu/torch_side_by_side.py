#!/usr/bin/env python3
"""The PyTorch side of the side-by-side (performance issue), run on the GPU machine.

Two parts, each written to OUT as JSON (and printed as a table):

* `ops`: the best PyTorch composition of the math of each weft decode kernel, on the shapes of
  one Moonlight layer (batch 1 and 64, context 1024 and 4096) and of a 1024-token prefill.
  Device time per call is the sum of the CUPTI kernel durations (torch.profiler) over many calls
  divided by the calls, i.e. the same quantity Nsight's `gpu__time_duration` gives for weft's
  kernels. Weights rotate over enough copies (≥ 256 MB) that they come from HBM, not from L2,
  as in a real step; routed experts change every call.
* `generate`: Hugging Face transformers' DeepseekV3ForCausalLM (bf16, random weights, the dummy
  config) — `generate` without compilation, single stream and batch 32, 1024-token prompts;
  decode time per token = (time of n+1 tokens − time of 1 token) / n, best of 2.

    python3 scripts/gpu/torch_side_by_side.py ops|generate CONFIG.json OUT_DIR

Runs on a CPU too (tiny shapes, wall-clock times) so that the script itself can be checked.
"""
import json, math, os, sys, time
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
BF = torch.bfloat16
L2_ROTATE = 256 << 20


def device_us(fn, calls):
    """Mean device time of `fn(i)` in µs: CUPTI kernel time summed over `calls` calls."""
    for i in range(3):
        fn(i)
    if not CUDA:
        t = time.perf_counter()
        for i in range(calls):
            fn(i)
        return (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for i in range(calls):
            fn(i)
        torch.cuda.synchronize()
    total = 0.0
    for e in p.key_averages():
        total += getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0)
    return total / calls


def copies(nbytes, cap=64):
    return max(1, min(cap, math.ceil(L2_ROTATE / max(nbytes, 1))))


def rand(*shape, dtype=BF, scale=1.0):
    return (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale).to(dtype)


def ops(cfg, out):
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, vdim, lat = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    E, K, inter = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    shared_inter = inter * cfg.get("n_shared_experts", 0)
    vocab, eps = cfg["vocab_size"], cfg["rms_norm_eps"]
    qdim = heads * (nope + rope)
    small = not CUDA
    if small:  # shapes for checking the script on a CPU
        vocab, E = 4096, 16
    rows = []

    def add(name, batch, ctx, us, note=""):
        rows.append({"op": name, "batch": batch, "ctx": ctx, "us": round(us, 2), "note": note})
        print(f"| {name} | {batch} | {ctx or ''} | {us:.1f} | {note} |", flush=True)

    def linear_op(name, n, k, batch, calls=200):
        ws = [rand(n, k, scale=k ** -0.5) for _ in range(copies(n * k * 2))]
        x = rand(batch, k)
        add(name, batch, 0, device_us(lambda i: F.linear(x, ws[i % len(ws)]), calls), f"F.linear {n}x{k} bf16")

    print("| op | batch | ctx | device µs | composition |\n| --- | ---: | ---: | ---: | --- |")
    batches = [1, 64] if not small else [1, 4]
    for b in batches:
        res, x, w = rand(b, h), rand(b, h), rand(h)
        def add_norm(i):
            r = res + x
            return F.rms_norm(r, (h,), w, eps)
        add("add_rms_norm", b, 0, device_us(add_norm, 200), "add + F.rms_norm")
        linear_op("linear q_proj", qdim, h, b)
        linear_op("linear kv_a", lat + rope, h, b)
        linear_op("linear o_proj", h, heads * vdim, b)
        linear_op("linear shared down", h, shared_inter, b)
        linear_op("linear dense down (layer 0)", h, cfg["intermediate_size"], b)
        for name, n in (("gated_up shared", 2 * shared_inter), ("gated_up dense (layer 0)", 2 * cfg["intermediate_size"])):
            ws = [rand(n, h, scale=h ** -0.5) for _ in range(copies(n * h * 2))]
            xx = rand(b, h)
            def gated(i, ws=ws, xx=xx):
                g, u = F.linear(xx, ws[i % len(ws)]).chunk(2, dim=-1)
                return F.silu(g) * u
            add(name, b, 0, device_us(gated, 200), "F.linear + silu * up")
        # head_linear: per-head projections of absorbed MLA (W_UK^T, W_UV), batched matmul.
        for name, a, c in (("head_linear w_uk", nope, lat), ("head_linear w_uv", lat, vdim)):
            ws = [rand(heads, a, c, scale=a ** -0.5) for _ in range(copies(heads * a * c * 2))]
            q = rand(heads, b, a)
            add(name, b, 0, device_us(lambda i: torch.bmm(q, ws[i % len(ws)]), 200), f"torch.bmm {heads}x({b}x{a} @ {a}x{c})")
        # router: f32 logits, sigmoid, bias, top-k, normalise, scale (noaux_tc, one group).
        wr = [rand(E, h, dtype=torch.float32, scale=h ** -0.5) for _ in range(copies(E * h * 4))]
        bias = rand(E, dtype=torch.float32, scale=0.01)
        xf = rand(b, h, dtype=torch.float32)
        def router(i):
            s = torch.sigmoid(F.linear(xf, wr[i % len(wr)]))
            idx = torch.topk(s + bias, K, dim=-1).indices
            wt = s.gather(-1, idx)
            return idx, wt / wt.sum(-1, keepdim=True) * cfg["routed_scaling_factor"]
        add("router", b, 0, device_us(router, 200), "f32 F.linear + sigmoid + topk + normalise")
        moe(cfg, b, E, K, h, inter, add)
        # lm_head + the sampling front end (top-64 candidates and log-sum-exp per row).
        wl = rand(vocab, h, scale=h ** -0.5)
        xl = rand(b, h)
        def head(i):
            lg = F.linear(xl, wl).float()
            return torch.topk(lg, 64, dim=-1), torch.logsumexp(lg, -1)
        add("lm_head + top-64", b, 0, device_us(head, 50), f"F.linear {vocab}x{h} + topk + logsumexp")
        for ctx in ([1024, 4096] if not small else [64]):
            mla(b, ctx, heads, lat, rope, add)
    prefill(cfg, 1024 if not small else 64, heads, nope, rope, vdim, lat, E, K, h, inter, add)
    json.dump({"device": torch.cuda.get_device_name() if CUDA else "cpu", "torch": torch.__version__, "rows": rows},
              open(os.path.join(out, "torch_ops.json"), "w"), indent=1)


def moe(cfg, b, E, K, h, inter, add):
    """Routed experts of one layer: permutation by expert, grouped GEMMs, SiLU, weighted combine."""
    wgu = rand(E, 2 * inter, h, scale=h ** -0.5)
    wd = rand(E, h, inter, scale=inter ** -0.5)
    x = rand(b, h)
    g = torch.Generator(device="cpu").manual_seed(1)
    routes = [torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(b)]).to(DEV) for _ in range(32)]
    wts = torch.rand(b, K, device=DEV)

    def grouped(i):
        idx = routes[i % len(routes)].flatten()
        order = torch.argsort(idx)
        tok = order // K
        offs = torch.cumsum(torch.bincount(idx, minlength=E), 0).to(torch.int32)
        xs = x.index_select(0, tok)
        gu = F.grouped_mm(xs, wgu.transpose(-2, -1), offs=offs)
        gt, up = gu.chunk(2, dim=-1)
        y = F.grouped_mm(F.silu(gt) * up, wd.transpose(-2, -1), offs=offs)
        return torch.zeros(b, h, device=DEV, dtype=y.dtype).index_add_(0, tok, y * wts.flatten()[order, None].to(y.dtype))

    def loop(i):  # transformers' eager: one pair of GEMMs per selected expert
        idx = routes[i % len(routes)]
        outp = torch.zeros(b, h, device=DEV, dtype=BF)
        for e in torch.unique(idx).tolist():
            t, k = torch.where(idx == e)
            gt, up = F.linear(x[t], wgu[e]).chunk(2, dim=-1)
            outp.index_add_(0, t, F.linear(F.silu(gt) * up, wd[e]) * wts[t, k, None].to(BF))
        return outp

    best = None
    for name, fn in (("grouped_mm", grouped), ("per-expert loop", loop)):
        try:
            us = device_us(fn, 50)
        except Exception as e:  # grouped_mm needs bf16 on SM ≥ 80
            print(f"  moe {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        add(f"moe experts ({name})", b, 0, us, f"{E} experts top-{K}, inter {inter}: permute + 2 GEMMs + silu + combine")
        best = us if best is None else min(best, us)
    return best


def mla(b, ctx, heads, lat, rope, add):
    """Absorbed MLA decode over a latent cache [b, ctx, lat + rope]: scores, softmax, values."""
    for dt, label in ((torch.float32, "f32 cache"), (BF, "bf16 cache")):
        nbytes = b * ctx * (lat + rope) * (4 if dt == torch.float32 else 2)
        n = max(1, min(4, math.ceil(L2_ROTATE / nbytes)))
        if nbytes * n > (40 << 30):
            continue
        caches = [rand(b, ctx, lat + rope, dtype=dt) for _ in range(n)]
        q = rand(b, heads, lat + rope, dtype=dt)
        scale = 0.0625

        def bmm(i):
            c = caches[i % n]
            s = torch.matmul(q, c.transpose(1, 2)) * scale
            p = torch.softmax(s.float(), dim=-1).to(dt)
            return torch.matmul(p, c[..., :lat])

        def sdpa(i):  # one shared latent "head" for all query heads
            c = caches[i % n].unsqueeze(1)
            return F.scaled_dot_product_attention(q.unsqueeze(2), c, c[..., :lat], scale=scale, enable_gqa=True)

        for name, fn in (("matmul+softmax", bmm), ("sdpa", sdpa)):
            try:
                us = device_us(fn, 20)
            except Exception as e:
                print(f"  mla {name} {label}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            add(f"mla decode ({name}, {label})", b, ctx, us, f"{heads} heads, {nbytes / us / 1e3:.0f} GB/s over the cache")


def prefill(cfg, n, heads, nope, rope, vdim, lat, E, K, h, inter, add):
    """One layer's attention and routed experts for an n-token prompt."""
    q = rand(1, heads, n, nope + rope)
    k = rand(1, heads, n, nope + rope)
    v = rand(1, heads, n, vdim)
    add("prefill attention (sdpa causal)", n, 0, device_us(lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=True), 20),
        f"{heads} heads, qk {nope + rope}, v {vdim}")
    ckv = rand(n, lat)
    wkvb = rand(heads * (nope + vdim), lat, scale=lat ** -0.5)
    add("prefill kv_b decompression", n, 0, device_us(lambda i: F.linear(ckv, wkvb), 20), f"F.linear {heads * (nope + vdim)}x{lat}")
    moe(cfg, n, E, K, h, inter, add)


def generate(cfg_path, out):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(cfg_path)))
    if not CUDA:
        cfg.num_hidden_layers, cfg.vocab_size, cfg.n_routed_experts = 2, 4096, 16
    prompt_len = 1024 if CUDA else 32
    results = []
    for experts in (sys.argv[4].split(",") if len(sys.argv) > 4 else ["eager", "grouped_mm"]):
        torch.manual_seed(0)
        t = time.perf_counter()
        with torch.device(DEV):
            try:
                model = AutoModelForCausalLM.from_config(cfg, dtype=BF, experts_implementation=experts)
            except TypeError:  # transformers without the keyword
                cfg._experts_implementation = experts
                model = AutoModelForCausalLM.from_config(cfg, dtype=BF)
        model.eval()
        load = time.perf_counter() - t
        for batch, n in ((1, 32), (32, 16)):
            ids = torch.randint(100, cfg.vocab_size - 100, (batch, prompt_len), device=DEV)

            def run(m):
                if CUDA:
                    torch.cuda.synchronize()
                t = time.perf_counter()
                with torch.no_grad():
                    o = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=m, min_new_tokens=m,
                                       do_sample=False, pad_token_id=0)
                if CUDA:
                    torch.cuda.synchronize()
                assert o.shape[1] == prompt_len + m
                return time.perf_counter() - t

            run(2)
            first, total = min(run(1) for _ in range(2)), min(run(n + 1) for _ in range(2))
            per_tok = (total - first) / n
            r = {"experts": experts, "attn": model.config._attn_implementation, "batch": batch, "prompt": prompt_len,
                 "prefill_s": round(first, 4), "decode_ms_per_step": round(per_tok * 1e3, 2),
                 "decode_tok_s": round(batch / per_tok, 1), "load_s": round(load, 1)}
            results.append(r)
            print(json.dumps(r), flush=True)
        del model
        if CUDA:
            torch.cuda.empty_cache()
    json.dump({"transformers": __import__("transformers").__version__, "torch": torch.__version__, "runs": results},
              open(os.path.join(out, "transformers_generate.json"), "w"), indent=1)


if __name__ == "__main__":
    mode, cfg_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out, exist_ok=True)
    if mode == "ops":
        ops(json.load(open(cfg_path)), out)
    else:
        generate(cfg_path, out)
