#!/usr/bin/env python3
"""Trains weft's bundled demo models on the fortune-cookie corpus (scripts/demo/fetch_corpus.sh):
a byte-level BPE tokenizer with a chat template, a small DeepSeek-V3-architecture model
(MLA + MoE, transformers' DeepseekV3ForCausalLM as the definition) and a smaller draft model
sharing the tokenizer. Writes both in the published Hugging Face layout (per-expert tensor
names, bf16), plus heldout.json: documents never trained on and their summed negative
log-likelihood under the saved weights, which weft's tests recompute.

    python3 scripts/demo/train_demo.py --corpus .device/corpus/fortunes.txt --out OUTDIR --minutes 4
"""
import argparse, json, math, os, random, time
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

BOS, EOS, USER, ASSISTANT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
CHAT_TEMPLATE = (
    "{% set ns = namespace(system='') %}{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}{% endif %}{% endfor %}"
    "{{ bos_token }}{{ ns.system }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜>' + m['content'] + eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)
ASKS = ["Tell me a fortune.", "Say something wise.", "Tell me a joke.", "What do you think?", "Any advice?", "Hello!"]

DEMO = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)
DRAFT = dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
             n_routed_experts=4, num_experts_per_tok=1, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)


def config(shape, vocab, bos, eos):
    return dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=vocab, num_key_value_heads=shape["num_attention_heads"],
                moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=1.0,
                rms_norm_eps=1e-6, hidden_act="silu", max_position_embeddings=2048, rope_theta=10000.0, rope_scaling=None,
                rope_interleave=True, tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, initializer_range=0.02,
                use_cache=True, bos_token_id=bos, eos_token_id=eos, num_nextn_predict_layers=0, **shape)


def train_tokenizer(texts, vocab, out_dir):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[BOS, EOS, USER, ASSISTANT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)])
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    return tok


def write_text_files(out_dir, tok_src, bos, eos):
    if tok_src != out_dir:
        import shutil
        shutil.copy(os.path.join(tok_src, "tokenizer.json"), out_dir)
    json.dump({"bos_token": {"content": BOS, "special": True}, "eos_token": EOS, "add_bos_token": True, "chat_template": CHAT_TEMPLATE,
               "model_max_length": 2048, "tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(out_dir, "tokenizer_config.json"), "w"), indent=1, ensure_ascii=False)
    json.dump({"bos_token_id": bos, "eos_token_id": eos, "do_sample": True, "temperature": 0.8, "top_p": 0.95}, open(os.path.join(out_dir, "generation_config.json"), "w"))


def published_state_dict(model):
    """transformers keeps experts fused; checkpoints publish them one tensor per expert."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().to(torch.bfloat16).cpu().contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    return out


def doc_ids(tok, text, chat, rng, bos, eos):
    if chat:
        ids = [bos, tok.token_to_id(USER)] + tok.encode(rng.choice(ASKS), add_special_tokens=False).ids + [tok.token_to_id(ASSISTANT)]
    else:
        ids = [bos]
    return ids + tok.encode(text, add_special_tokens=False).ids + [eos]


@torch.no_grad()
def nll(model, docs, dev):
    """Summed next-token NLL and token count of each document, one forward each."""
    res = []
    for ids in docs:
        x = torch.tensor([ids], device=dev)
        logp = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
        res.append((float(-logp.gather(1, x[0, 1:, None]).sum()), len(ids) - 1))
    return res


def train(name, shape, stream, val_docs, vocab, bos, eos, minutes, out_dir, tok_dir, dev, lr, seq=256, batch=64):
    from transformers import DeepseekV3ForCausalLM, DeepseekV3Config
    cfg = config(shape, vocab, bos, eos)
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**cfg)).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    data = torch.tensor(stream, device=dev)
    n_win = (len(stream) - 1) // seq
    best, best_state, step, t0 = float("inf"), None, 0, time.time()
    total_steps_guess = None
    print(f"[{name}] {nparams/1e6:.2f}M parameters, {len(stream)} training tokens", flush=True)
    while time.time() - t0 < minutes * 60:
        idx = torch.randint(0, n_win, (batch,), device=dev) * seq + torch.randint(0, seq, (batch,), device=dev) % 8
        x = torch.stack([data[i:i + seq] for i in idx.tolist()])
        y = torch.stack([data[i + 1:i + seq + 1] for i in idx.tolist()])
        frac = min(1.0, (time.time() - t0) / (minutes * 60))
        for g in opt.param_groups:
            g["lr"] = lr * (min(1.0, step / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
            logits = model(x).logits
        loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 250 == 0:
            model.eval()
            r = nll(model, val_docs[:300], dev)
            vl = sum(a for a, _ in r) / sum(b for _, b in r)
            model.train()
            print(f"[{name}] step {step} train {loss.item():.3f} val {vl:.3f} ppl {math.exp(vl):.1f} ({time.time()-t0:.0f}s)", flush=True)
            if vl < best:
                best, best_state = vl, {k: v.detach().clone() for k, v in model.state_dict().items()}
    if best_state is not None:
        model.load_state_dict(best_state)
    os.makedirs(out_dir, exist_ok=True)
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=1)
    save_file(published_state_dict(model), os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_text_files(out_dir, tok_dir, bos, eos)
    return step, nparams


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--draft-minutes", type=float, default=1.5)
    ap.add_argument("--vocab", type=int, default=2048)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    docs = [d for d in open(args.corpus).read().split("\n\n") if d.strip()]
    # Every 20th fortune is held out: never in the tokenizer's or the model's training data.
    train_docs = [d for i, d in enumerate(docs) if i % 20 != 7]
    held_docs = [d for i, d in enumerate(docs) if i % 20 == 7]
    demo_dir, draft_dir = os.path.join(args.out, "demo"), os.path.join(args.out, "demo-draft")
    os.makedirs(demo_dir, exist_ok=True)
    tok = train_tokenizer(train_docs, args.vocab, demo_dir)
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    rng = random.Random(0)
    stream = []
    for epoch in range(3):  # three shuffled passes, a third of documents in chat form
        order = list(range(len(train_docs)))
        rng.shuffle(order)
        for i in order:
            stream += doc_ids(tok, train_docs[i], rng.random() < 0.3, rng, bos, eos)
    val_ids = [doc_ids(tok, d, False, rng, bos, eos) for d in held_docs]
    steps, nparams = train("demo", DEMO, stream, val_ids, args.vocab, bos, eos, args.minutes, demo_dir, demo_dir, dev, lr=2e-3)
    dsteps, dparams = train("draft", DRAFT, stream, val_ids, args.vocab, bos, eos, args.draft_minutes, draft_dir, demo_dir, dev, lr=3e-3)

    # Held-out NLL under the *saved* bf16 weights, loaded back through from_pretrained in float32.
    from transformers import DeepseekV3ForCausalLM
    report = {"corpus": "Debian package `fortunes` (fortune-mod data files, BSD licence)", "held_out_rule": "every 20th fortune (index % 20 == 7)",
              "held_out_documents": len(val_ids)}
    for name, d, st, npar in (("demo", demo_dir, steps, nparams), ("draft", draft_dir, dsteps, dparams)):
        m = DeepseekV3ForCausalLM.from_pretrained(d, dtype=torch.float32, experts_implementation="eager").to(dev).eval()
        r = nll(m, val_ids, dev)
        tot, cnt = sum(a for a, _ in r), sum(b for _, b in r)
        report[name] = {"parameters": npar, "steps": st, "heldout_tokens": cnt, "heldout_ppl": math.exp(tot / cnt)}
        if name == "demo":
            sample = list(range(40))
            report["check"] = {"documents": [val_ids[i] for i in sample], "nll": [r[i][0] for i in sample], "tokens": [r[i][1] for i in sample]}
        print(f"[{name}] held-out perplexity {math.exp(tot/cnt):.2f} over {cnt} tokens", flush=True)
    json.dump(report, open(os.path.join(demo_dir, "heldout.json"), "w"))
    # a few samples for the log
    m = DeepseekV3ForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).to(dev).eval()
    for p in ["The", "A man", "Love is"]:
        x = torch.tensor([tok.encode(p).ids], device=dev)
        y = m.generate(x, max_new_tokens=40, do_sample=True, temperature=0.8, top_p=0.95)
        print("SAMPLE:", repr(tok.decode(y[0].tolist())), flush=True)


if __name__ == "__main__":
    main()
