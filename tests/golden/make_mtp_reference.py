#!/usr/bin/env python3
"""Writes `mtp_reference.json` for every golden fixture that carries a multi-token-prediction
layer (`num_nextn_predict_layers` > 0): the MTP module's next-next-token log-probabilities, from
an implementation independent of weft.

DeepSeek-V3's MTP module at position p takes the main model's final-normed hidden state h_p and
the embedding of the token at p+1, and predicts the token at p+2:

    x_p = eh_proj(concat(enorm(embed(t_{p+1})), hnorm(h_p)))
    g   = decoder block over x_0..x_p (causal MLA at positions 0..p, then the MoE)
    logits_p = head(shared_head.norm(g_p))      # head: shared_head.head, else lm_head

transformers' DeepseekV3ForCausalLM has no MTP module, so the reference runs the block as a
one-layer DeepseekV3ForCausalLM (the MTP layer's weights as layer 0, shared_head.norm as the
final norm, the same lm_head) fed `inputs_embeds = x`; h comes from the full model. float64,
experts implementation eager, weights read back from the published (bf16) checkpoint.

    python3 tests/golden/make_mtp_reference.py       # after make_fixtures.py; needs torch, transformers
"""
import json, os, sys
import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import HERE, reference_model  # noqa: E402


def published_weights(d):
    """The checkpoint's tensors in float64 (bf16 exactly; this script covers bf16 fixtures)."""
    sd = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            for k, v in load_file(os.path.join(d, f)).items():
                assert v.dtype == torch.bfloat16, f"{k}: {v.dtype} (fp8 fixtures are not covered)"
                sd[k] = v.to(torch.float64)
    return sd


def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


@torch.no_grad()
def mtp_fixture(d):
    c = json.load(open(os.path.join(d, "config.json")))
    if not c.get("num_nextn_predict_layers"):
        return False
    L, eps = c["num_hidden_layers"], c["rms_norm_eps"]
    sd = published_weights(d)
    main = reference_model(c, {k: v for k, v in sd.items() if not k.startswith(f"model.layers.{L}.")})
    p = f"model.layers.{L}."
    block = {"model.embed_tokens.weight": sd["model.embed_tokens.weight"], "model.norm.weight": sd[p + "shared_head.norm.weight"],
             "lm_head.weight": sd.get(p + "shared_head.head.weight", sd["lm_head.weight"])}
    for k, v in sd.items():
        if k.startswith(p) and not any(s in k for s in ("enorm", "hnorm", "eh_proj", "shared_head")):
            block["model.layers.0." + k[len(p):]] = v
    # The MTP layer is a MoE layer whenever the main model's last layer is.
    mtp = reference_model(dict(c, num_hidden_layers=1, first_k_dense_replace=0 if L >= c["first_k_dense_replace"] else 1), block)
    ref = json.load(open(os.path.join(d, "reference.json")))
    cases = []
    for case in ref["cases"]:
        ids = case["prompt_ids"]
        x = torch.tensor([ids])
        h = main.model(x).last_hidden_state[0]  # final-normed
        e = sd["model.embed_tokens.weight"][torch.tensor(ids[1:])]
        inp = torch.cat([rms(e, sd[p + "enorm.weight"], eps), rms(h[:-1], sd[p + "hnorm.weight"], eps)], dim=-1) @ sd[p + "eh_proj.weight"].T
        logp = torch.log_softmax(mtp(inputs_embeds=inp[None]).logits[0].to(torch.float64), dim=-1)
        rows = []
        for i in range(len(ids) - 1):
            tv, ti = logp[i].topk(5)
            rows.append({"top": {str(int(t)): float(v) for v, t in zip(tv, ti)}, "margin": float(tv[0] - tv[1])})
        cases.append({"prompt_ids": ids, "mtp_logprobs": rows})
    json.dump({"fixture": os.path.basename(d), "torch": torch.__version__, "transformers": __import__("transformers").__version__,
               "dtype": "float64", "experts_implementation": "eager", "cases": cases}, open(os.path.join(d, "mtp_reference.json"), "w"))
    print(f"{os.path.basename(d)}: MTP reference for {len(cases)} prompts")
    return True


def main():
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    done = [n for n in sorted(os.listdir(HERE)) if os.path.isdir(os.path.join(HERE, n)) and mtp_fixture(os.path.join(HERE, n))]
    assert done, "no fixture has an MTP layer"


if __name__ == "__main__":
    main()
