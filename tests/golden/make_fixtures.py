#!/usr/bin/env python3
"""Writes weft's golden fixtures: tiny DeepSeek-V3-family checkpoints in the published
Hugging Face layout plus reference outputs from transformers' DeepseekV3ForCausalLM in float64.

Independent of weft: weights are random (fixed seeds), the reference is transformers' eager
implementation loading the published per-expert tensor names through from_pretrained.

    python3 tests/golden/make_fixtures.py            # writes tests/golden/<fixture>/

Needs torch and transformers 5.x (any CPU or GPU machine; float64 runs on the CPU fine).
"""
import json, math, os, shutil, sys, tempfile
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))

BOS, EOS, USER, ASSISTANT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
CHAT_TEMPLATE = (
    "{% set ns = namespace(system='') %}{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}{% endif %}{% endfor %}"
    "{{ bos_token }}{{ ns.system }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜>' + m['content'] + eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)
CORPUS = """When in the Course of human events, it becomes necessary for one people to dissolve the political bands
which have connected them with another, and to assume among the powers of the earth, the separate and equal station
to which the Laws of Nature and of Nature's God entitle them, a decent respect to the opinions of mankind requires
that they should declare the causes which impel them to the separation. We hold these truths to be self-evident,
that all men are created equal, that they are endowed by their Creator with certain unalienable Rights, that among
these are Life, Liberty and the pursuit of Happiness. The quick brown fox jumps over the lazy dog. 0123456789
Sphinx of black quartz, judge my vow! How vexingly quick daft zebras jump. Pack my box with five dozen liquor jugs."""


def make_tokenizer(out_dir, vocab_size, corpus=CORPUS):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS, USER, ASSISTANT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([corpus] * 4, trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    json.dump({"bos_token": {"content": BOS, "special": True}, "eos_token": EOS, "add_bos_token": True,
               "chat_template": CHAT_TEMPLATE, "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"},
              open(os.path.join(out_dir, "tokenizer_config.json"), "w"), indent=1, ensure_ascii=False)
    return tok, bos_id, tok.token_to_id(EOS)


def lin(g, out_f, in_f, gain=1.0):
    return torch.randn(out_f, in_f, generator=g, dtype=torch.float64) * (gain / math.sqrt(in_f))


def norm_w(g, n):
    return 1.0 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


def decoder_layer(g, c, i, sd):
    p = f"model.layers.{i}"
    h, H = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    sd[f"{p}.input_layernorm.weight"] = norm_w(g, h)
    sd[f"{p}.post_attention_layernorm.weight"] = norm_w(g, h)
    if c["q_lora_rank"] is None:
        sd[f"{p}.self_attn.q_proj.weight"] = lin(g, H * qk, h)
    else:
        r = c["q_lora_rank"]
        sd[f"{p}.self_attn.q_a_proj.weight"] = lin(g, r, h)
        sd[f"{p}.self_attn.q_a_layernorm.weight"] = norm_w(g, r)
        sd[f"{p}.self_attn.q_b_proj.weight"] = lin(g, H * qk, r)
    L = c["kv_lora_rank"]
    sd[f"{p}.self_attn.kv_a_proj_with_mqa.weight"] = lin(g, L + c["qk_rope_head_dim"], h)
    sd[f"{p}.self_attn.kv_a_layernorm.weight"] = norm_w(g, L)
    sd[f"{p}.self_attn.kv_b_proj.weight"] = lin(g, H * (c["qk_nope_head_dim"] + c["v_head_dim"]), L)
    sd[f"{p}.self_attn.o_proj.weight"] = lin(g, h, H * c["v_head_dim"])

    def mlp(prefix, inter):
        sd[f"{prefix}.gate_proj.weight"] = lin(g, inter, h)
        sd[f"{prefix}.up_proj.weight"] = lin(g, inter, h)
        sd[f"{prefix}.down_proj.weight"] = lin(g, h, inter)

    if i >= c["first_k_dense_replace"]:
        E = c["n_routed_experts"]
        sd[f"{p}.mlp.gate.weight"] = lin(g, E, h, gain=2.0)
        sd[f"{p}.mlp.gate.e_score_correction_bias"] = 0.05 * torch.randn(E, generator=g, dtype=torch.float64)
        for e in range(E):
            mlp(f"{p}.mlp.experts.{e}", c["moe_intermediate_size"])
        if c["n_shared_experts"]:
            mlp(f"{p}.mlp.shared_experts", c["moe_intermediate_size"] * c["n_shared_experts"])
    else:
        mlp(f"{p}.mlp", c["intermediate_size"])


def state_dict(c, seed):
    g = torch.Generator().manual_seed(seed)
    sd = {}
    V, h = c["vocab_size"], c["hidden_size"]
    sd["model.embed_tokens.weight"] = torch.randn(V, h, generator=g, dtype=torch.float64)
    for i in range(c["num_hidden_layers"]):
        decoder_layer(g, c, i, sd)
    sd["model.norm.weight"] = norm_w(g, h)
    if not c.get("tie_word_embeddings"):
        sd["lm_head.weight"] = lin(g, V, h, gain=3.0)
    for k in range(c.get("num_nextn_predict_layers", 0)):
        i = c["num_hidden_layers"] + k
        decoder_layer(g, c, i, sd)
        p = f"model.layers.{i}"
        sd[f"{p}.enorm.weight"] = norm_w(g, h)
        sd[f"{p}.hnorm.weight"] = norm_w(g, h)
        sd[f"{p}.eh_proj.weight"] = lin(g, h, 2 * h)
        sd[f"{p}.shared_head.norm.weight"] = norm_w(g, h)
    return sd


def quantize_fp8(w, block):
    """Block-wise e4m3 quantization as DeepSeek publishes it: q = w / s, stored s = weight_scale_inv."""
    br, bc = block
    R, C = w.shape
    gr, gc = -(-R // br), -(-C // bc)
    scale = torch.empty(gr, gc, dtype=torch.float32)
    q = torch.empty(R, C, dtype=torch.float8_e4m3fn)
    for i in range(gr):
        for j in range(gc):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            s = float(blk.abs().max()) / 448.0 or 1.0
            scale[i, j] = s
            q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q, scale, block):
    br, bc = block
    s = scale.to(torch.float64).repeat_interleave(br, 0)[: q.shape[0]].repeat_interleave(bc, 1)[:, : q.shape[1]]
    return q.to(torch.float64) * s


def is_fp8_target(name, c):
    # As DeepSeek's fp8 checkpoints: linear weights inside decoder layers; not norms, router, embeddings, heads.
    if not name.startswith("model.layers.") or not name.endswith(".weight"):
        return False
    return any(k in name for k in ("_proj.weight",)) and ".mlp.gate.weight" not in name


def write_checkpoint(out_dir, c, sd, fp8_block=None, shards=1):
    """Writes config + weights in the published layout; returns the float64 weights the reference uses."""
    os.makedirs(out_dir, exist_ok=True)
    publish, ref = {}, {}
    for name, w in sd.items():
        if fp8_block and is_fp8_target(name, c):
            q, s = quantize_fp8(w, fp8_block)
            publish[name] = q.contiguous()
            publish[name + "_scale_inv"] = s.contiguous()
            ref[name] = dequantize_fp8(q, s, fp8_block)
        else:
            b = w.to(torch.bfloat16)
            publish[name] = b.contiguous()
            ref[name] = b.to(torch.float64)
    names = sorted(publish)
    if shards == 1:
        save_file(publish, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    else:
        per = -(-len(names) // shards)
        weight_map = {}
        for s in range(shards):
            fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: publish[n] for n in names[s * per:(s + 1) * per]}
            save_file(part, os.path.join(out_dir, fn), metadata={"format": "pt"})
            weight_map.update({n: fn for n in part})
        json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(out_dir, "model.safetensors.index.json"), "w"), indent=1)
    cfg = dict(c)
    if fp8_block:
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(fp8_block)}
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=1)
    return ref


def reference_model(c, ref_sd):
    """transformers' DeepseekV3ForCausalLM in float64, loaded by from_pretrained from published names."""
    from transformers import DeepseekV3ForCausalLM
    tmp = tempfile.mkdtemp()
    try:
        # transformers maps published per-expert names only under model_type deepseek_v3; kimi_k2
        # is the same architecture under another name.
        json.dump(dict(c, model_type="deepseek_v3"), open(os.path.join(tmp, "config.json"), "w"))
        save_file({k: v.contiguous() for k, v in ref_sd.items()}, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        model = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float64, experts_implementation="eager")
    finally:
        shutil.rmtree(tmp)
    model.eval()
    # Verify every published tensor reached the model (no silently random-initialised weights).
    for name, w in ref_sd.items():
        if name.startswith(f"model.layers.{c['num_hidden_layers']}"):
            continue  # MTP layer: not part of DeepseekV3ForCausalLM
        if ".mlp.experts." in name:
            # fused by the loader into experts.gate_up_proj [E, 2I, H] / experts.down_proj [E, H, I]
            layer, e, kind = name.split(".")[2], int(name.split(".")[5]), name.split(".")[6]
            ex = model.model.layers[int(layer)].mlp.experts
            I = ex.down_proj.shape[-1]
            got = {"gate_proj": ex.gate_up_proj[e, :I], "up_proj": ex.gate_up_proj[e, I:], "down_proj": ex.down_proj[e]}[kind]
            assert torch.equal(got.detach(), w), f"{name} did not load exactly"
            continue
        got = dict(model.named_parameters()).get(name)
        if got is None:
            got = dict(model.named_buffers()).get(name)
        assert got is not None, f"reference model has no {name}"
        assert torch.equal(got.detach(), w), f"{name} did not load exactly"
    return model


@torch.no_grad()
def references(model, prompts, greedy_tokens=24, top=5):
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        logp = torch.log_softmax(model(x).logits[0].to(torch.float64), dim=-1)
        plp = [None]
        for i in range(1, len(ids)):
            row = logp[i - 1]
            tv, ti = row.topk(top)
            plp.append({"token": float(row[ids[i]]), "top": {str(int(t)): float(v) for v, t in zip(tv, ti)}})
        seq, greedy, margins = list(ids), [], []
        for _ in range(greedy_tokens):
            logits = model(torch.tensor([seq])).logits[0, -1].to(torch.float64)
            t2 = logits.topk(2)
            nxt = int(t2.indices[0])
            margins.append(float(t2.values[0] - t2.values[1]))
            greedy.append(nxt)
            seq.append(nxt)
        out.append({"prompt_ids": ids, "prompt_logprobs": plp, "greedy_ids": greedy, "greedy_margins": margins})
    return out


BASE_V3_YARN = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 24,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "max_position_embeddings": 1024, "rope_theta": 10000.0, "rope_interleave": True,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 0.707, "mscale_all_dim": 1.0},
    "tie_word_embeddings": False, "num_nextn_predict_layers": 1, "attention_bias": False, "attention_dropout": 0.0,
    "initializer_range": 0.02, "use_cache": True, "bos_token_id": 0, "eos_token_id": 1,
}

BASE_KIMI_FP8 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
    "vocab_size": 320, "hidden_size": 160, "intermediate_size": 200, "moe_intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": None, "kv_lora_rank": 64, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 2, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "norm_topk_prob": True, "routed_scaling_factor": 2.446, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rope_theta": 50000.0, "rope_scaling": None, "rope_interleave": True,
    "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
    "initializer_range": 0.02, "use_cache": True, "bos_token_id": 0, "eos_token_id": 1,
}


def build_fixture(name, cfg, seed, fp8_block=None, shards=1, long_prompt=0):
    out_dir = os.path.join(HERE, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    tok, bos, eos = make_tokenizer(out_dir, cfg["vocab_size"] - 16)
    json.dump({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}, open(os.path.join(out_dir, "generation_config.json"), "w"))
    sd = state_dict(cfg, seed)
    ref_sd = write_checkpoint(out_dir, cfg, sd, fp8_block, shards)
    model = reference_model(cfg, ref_sd)
    g = torch.Generator().manual_seed(seed + 1)
    V = cfg["vocab_size"]
    prompts = [tok.encode("We hold these truths to be self-evident").ids]
    prompts += [[bos] + torch.randint(4, V, (n,), generator=g).tolist() for n in (5, 17, 40)]
    if long_prompt:
        prompts.append([bos] + torch.randint(4, V, (long_prompt,), generator=g).tolist())
    refs = references(model, prompts)
    json.dump({"fixture": name, "torch": torch.__version__, "transformers": __import__("transformers").__version__,
               "dtype": "float64", "experts_implementation": "eager", "cases": refs},
              open(os.path.join(out_dir, "reference.json"), "w"))
    print(f"{name}: {len(refs)} cases, {sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))} bytes")


def main():
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    build_fixture("v3-qlora-yarn-groups", BASE_V3_YARN, seed=1, shards=2, long_prompt=300)
    build_fixture("kimi-fp8-partial-blocks", BASE_KIMI_FP8, seed=2, fp8_block=(128, 128))


if __name__ == "__main__":
    main()
