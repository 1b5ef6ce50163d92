"""The OpenAI-compatible API through the official `openai` client, over real HTTP."""

import time

import httpx
import pytest

from conftest import metric, wait_idle

NOEOS = {"ignore_eos": True}


def test_models_lists_the_served_model(client, model):
    ids = [m.id for m in client.models.list().data]
    assert ids == [model]


def test_health(http):
    r = http.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_greedy_completion_is_identical_to_weft_generate(client, model, greedy_ref):
    for ref in greedy_ref["completions"]:
        n = len(ref["token_ids"])
        r = client.completions.create(model=model, prompt=ref["prompt"], max_tokens=n, temperature=0, extra_body=NOEOS)
        assert r.choices[0].text == ref["text"], ref["prompt"]
        assert r.usage.prompt_tokens == len(ref["prompt_token_ids"])
        assert r.usage.completion_tokens == n
        assert r.usage.total_tokens == r.usage.prompt_tokens + n
        assert r.choices[0].finish_reason == "length"
        # The same prompt given as token ids.
        r2 = client.completions.create(model=model, prompt=ref["prompt_token_ids"], max_tokens=n, temperature=0, extra_body=NOEOS)
        assert r2.choices[0].text == ref["text"]


def test_greedy_chat_is_identical_to_weft_generate_chat(client, model, greedy_ref):
    ref = greedy_ref["chat"]
    n = len(ref["token_ids"])
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": ref["prompt"]}], max_tokens=n, temperature=0, extra_body=NOEOS)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref["text"]
    assert r.usage.prompt_tokens == len(ref["prompt_token_ids"])
    assert r.usage.completion_tokens == n


def test_streaming_completion_equals_non_streaming(client, model):
    args = dict(model=model, prompt="The best way to learn", max_tokens=20, temperature=0, extra_body=NOEOS)
    full = client.completions.create(**args)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_streaming_chat(client, model):
    args = dict(model=model, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a fortune."}], max_tokens=16, temperature=0, extra_body=NOEOS)
    full = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 16
    # Without include_usage there is no usage chunk.
    plain = list(client.chat.completions.create(stream=True, **args))
    assert all(c.usage is None for c in plain)


def test_n_choices_and_seed_reproducibility(client, model):
    args = dict(model=model, prompt="You will", max_tokens=12, temperature=1.0, seed=1234, n=4, extra_body=NOEOS)
    a = client.completions.create(**args)
    assert sorted(c.index for c in a.choices) == [0, 1, 2, 3]
    texts = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1, "n choices sample with different seeds"
    assert a.usage.completion_tokens == 4 * 12
    b = client.completions.create(**args)
    assert texts == [c.text for c in sorted(b.choices, key=lambda c: c.index)], "same seed, same choices"
    # Choice i samples with seed + i: a single request with seed 1235 reproduces choice 1.
    one = client.completions.create(**{**args, "n": 1, "seed": 1235})
    assert one.choices[0].text == texts[1]
    other = client.completions.create(**{**args, "n": 1, "seed": 99})
    assert other.choices[0].text != texts[0]


def test_n_choices_streaming(client, model):
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=6, n=3, seed=7, temperature=0.9, stream=True, stream_options={"include_usage": True}, extra_body=NOEOS))
    done = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert done == {0, 1, 2}
    assert chunks[-1].usage.completion_tokens == 18


def test_stop_string_across_token_boundaries(client, model):
    base = client.completions.create(model=model, prompt="A journey of a thousand miles", max_tokens=30, temperature=0, logprobs=0, extra_body=NOEOS)
    toks = base.choices[0].logprobs.tokens
    text = base.choices[0].text
    assert "".join(toks) == text
    # A stop string made of the end of token 5 and the start of token 6.
    k = next(i for i in range(5, len(toks) - 1) if len(toks[i]) >= 2 and len(toks[i + 1]) >= 2)
    stop = toks[k][-2:] + toks[k + 1][:2]
    cut = text.index(stop)
    r = client.completions.create(model=model, prompt="A journey of a thousand miles", max_tokens=30, temperature=0, stop=[stop, "\u2603never"], extra_body=NOEOS)
    assert r.choices[0].text == text[:cut]
    assert r.choices[0].finish_reason == "stop"
    s = list(client.completions.create(model=model, prompt="A journey of a thousand miles", max_tokens=30, temperature=0, stop=stop, stream=True, extra_body=NOEOS))
    assert "".join(c.choices[0].text for c in s if c.choices) == text[:cut]


def test_stop_token_ids_and_max_tokens_default(client, model, greedy_ref):
    ref = greedy_ref["completions"][0]
    base = client.completions.create(model=model, prompt=ref["prompt"], temperature=0, extra_body=NOEOS)
    assert base.usage.completion_tokens == 16, "completions default to 16 tokens"
    ids = ref["token_ids"]
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    r = client.completions.create(model=model, prompt=ref["prompt"], temperature=0, max_tokens=len(ids), extra_body={"stop_token_ids": [ids[k]], "ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == k + 1
    assert ref["text"].startswith(r.choices[0].text) and len(r.choices[0].text) < len(ref["text"])


def test_logprobs_completions(client, model):
    r = client.completions.create(model=model, prompt="Fortune favors", max_tokens=8, temperature=0, logprobs=3, extra_body=NOEOS)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0
        assert 1 <= len(top) <= 3
        # Greedy: the chosen token is the most likely one.
        assert abs(l - max(top.values())) < 1e-6
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_logprobs_chat(client, model):
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say something."}], max_tokens=6, temperature=0.7, seed=3, logprobs=True, top_logprobs=2, extra_body=NOEOS)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= -9999
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    assert "".join(e.token for e in content) == r.choices[0].message.content


def test_prompt_shapes_and_echo(client, model):
    r = client.completions.create(model=model, prompt=["One", "Two"], max_tokens=4, temperature=0, extra_body=NOEOS)
    assert sorted(c.index for c in r.choices) == [0, 1]
    one = client.completions.create(model=model, prompt="One", max_tokens=4, temperature=0, extra_body=NOEOS)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)][0] == one.choices[0].text
    ids = client.completions.create(model=model, prompt="One", max_tokens=1, temperature=0, logprobs=0, extra_body=NOEOS)
    r2 = client.completions.create(model=model, prompt=[[5, 6, 7], [8, 9]], max_tokens=3, temperature=0, extra_body=NOEOS)
    assert len(r2.choices) == 2 and r2.usage.prompt_tokens == 5
    e = client.completions.create(model=model, prompt="Once upon", max_tokens=4, temperature=0, echo=True, extra_body=NOEOS)
    assert e.choices[0].text.startswith("Once upon")
    assert ids.choices[0].logprobs.tokens


def test_penalties_and_logit_bias_change_output(client, model, greedy_ref):
    args = dict(model=model, prompt="The the the the", max_tokens=12, temperature=0, extra_body=NOEOS)
    plain = client.completions.create(**args).choices[0].text
    pen = client.completions.create(**{**args, "frequency_penalty": 2.0, "presence_penalty": 2.0}).choices[0].text
    assert pen != plain
    rep = client.completions.create(**{**args, "extra_body": {**NOEOS, "repetition_penalty": 3.0}}).choices[0].text
    assert rep != plain
    ref = greedy_ref["completions"][0]
    n = len(ref["token_ids"])
    # Forbidding the first greedy token changes the continuation...
    banned = client.completions.create(model=model, prompt=ref["prompt"], max_tokens=n, temperature=0, logit_bias={str(ref["token_ids"][0]): -100}, extra_body=NOEOS)
    assert banned.choices[0].text != ref["text"]
    # ...and a +100 bias makes one token win every step.
    forced = client.completions.create(model=model, prompt=ref["prompt"], max_tokens=5, temperature=0, logit_bias={str(ref["token_ids"][1]): 100}, logprobs=0, extra_body=NOEOS)
    toks = forced.choices[0].logprobs.tokens
    assert len(set(toks)) == 1 and len(toks) == 5


def test_sampler_plugin_selected_by_name(client, model, admin, plugin_dir):
    with open(f"{plugin_dir}/weft_example_top_a.wasm", "rb") as f:
        r = admin.post("/admin/plugins", content=f.read(), headers={"Content-Type": "application/wasm"})
    assert r.status_code == 200, r.text
    assert r.json()["loaded"]["name"] == "top-a"
    out = client.completions.create(model=model, prompt="Luck", max_tokens=8, seed=5, extra_body={"sampler": "top-a", "top_a": 0.5, "ignore_eos": True})
    assert out.usage.completion_tokens == 8
    calls = metric(httpx.get(str(client.base_url).replace("/v1/", "/metrics")).text, "weft_plugin_events_total", kind="sampler", name="top-a", version="0.1.0", what="calls")
    assert calls and calls >= 8


def test_metrics_exposes_latency_and_engine_state(http, client, model):
    client.completions.create(model=model, prompt="Metrics", max_tokens=4, temperature=0, extra_body=NOEOS)
    text = http.get("/metrics").text
    assert metric(text, "weft_time_to_first_token_seconds_count") >= 1
    assert metric(text, "weft_inter_token_latency_seconds_count") >= 1
    assert metric(text, "weft_e2e_request_latency_seconds_count") >= 1
    assert metric(text, "weft_engine", state="kv_pages_total") > 0
    assert metric(text, "weft_engine_events_total", event="generated_tokens") >= 4
    assert metric(text, "weft_requests_total", outcome="length") >= 1
    assert metric(text, "weft_plugin_events_total", kind="sampler", name="default", version="0.1.0", what="calls") is not None
    assert "weft_generation_tokens_per_second" in text and "weft_prefix_cache_hit_rate" in text


def test_prefix_cache_reuses_pages(client, model, http):
    # ~900 tokens of shared prefix (14 full pages of 64), then different endings.
    prefix = " ".join(f"Line {i}: a stitch in time saves nine, and the early bird gets the worm." for i in range(60))
    ttft = []
    usages = []
    for ending in [" What follows?", " And then?"]:
        t0 = time.perf_counter()
        first = None
        usage = None
        for c in client.completions.create(model=model, prompt=prefix + ending, max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=NOEOS):
            if first is None and c.choices:
                first = time.perf_counter() - t0
            if c.usage:
                usage = c.usage
        ttft.append(first)
        usages.append(usage)
    assert usages[0].prompt_tokens > 800
    cached = usages[1].prompt_tokens_details.cached_tokens
    assert cached >= 768 and cached % 64 == 0, cached
    assert metric(http.get("/metrics").text, "weft_prefix_cache_hit_rate") > 0
    print(f"\nprefix cache: prompt {usages[1].prompt_tokens} tokens, {cached} cached; TTFT cold {ttft[0]*1e3:.1f} ms, warm {ttft[1]*1e3:.1f} ms")


def test_admin_api_lifecycle(admin, http, plugin_dir):
    assert http.get("/admin/plugins").status_code == 401
    assert http.get("/admin/plugins", headers={"Authorization": "Bearer wrong"}).status_code == 401
    listed = admin.get("/admin/plugins").json()["plugins"]
    assert {(p["kind"], p["name"]) for p in listed} >= {("sampler", "default"), ("verifier", "default"), ("admission", "default")}
    v1 = open(f"{plugin_dir}/weft_test_swap_v1.wasm", "rb").read()
    v2 = open(f"{plugin_dir}/weft_test_swap_v2.wasm", "rb").read()
    r = admin.post("/admin/plugins", content=v2, params={"sha256": "00" * 32}, headers={"Content-Type": "application/wasm"})
    assert r.status_code == 400 and "sha256 mismatch" in r.json()["error"]["message"]
    r = admin.post("/admin/plugins", content=b"\0asm garbage", headers={"Content-Type": "application/wasm"})
    assert r.status_code == 400
    assert admin.post("/admin/plugins", json={"path": f"{plugin_dir}/weft_test_swap_v1.wasm"}).status_code == 200
    assert admin.post("/admin/plugins", content=v2, headers={"Content-Type": "application/wasm"}).json()["loaded"]["version"] == "2.0.0"
    swap = next(p for p in admin.get("/admin/plugins").json()["plugins"] if p["name"] == "swap")
    assert {v["version"]: v["active"] for v in swap["versions"]} == {"1.0.0": False, "2.0.0": True}
    assert admin.post("/admin/plugins/sampler/swap/rollback").json()["active"] == "1.0.0"
    assert admin.delete("/admin/plugins/sampler/swap/1.0.0").status_code == 409, "the active version cannot be unloaded"
    assert admin.put("/admin/plugins/sampler/swap/policy", json={"policy": "fail"}).status_code == 200
    assert admin.put("/admin/plugins/sampler/swap/policy", json={"policy": "maybe"}).status_code == 400
    assert admin.post("/admin/plugins/sampler/swap/activate", json={"version": "2.0.0"}).status_code == 200
    assert admin.delete("/admin/plugins/sampler/swap/1.0.0").status_code == 200
    assert admin.post("/admin/plugins/sampler/nope/rollback").status_code == 404
    assert admin.post("/admin/plugins/gizmo/swap/rollback").status_code == 404
    assert admin.get("/admin/engine").json()["kv_pages"]["total"] > 0
    wait_idle(admin)


def test_admission_rejection_is_429_with_its_reason(client, model, admin, http, plugin_dir):
    import openai

    wasm = open(f"{plugin_dir}/weft_admission_default.wasm", "rb").read()
    r = admin.post("/admin/plugins", content=wasm, params={"options": '{"policy": "fcfs", "max_queue": 0}'}, headers={"Content-Type": "application/wasm"})
    assert r.status_code == 200, r.text
    try:
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=model, prompt="Let me in", max_tokens=2)
        assert "queue full" in str(e.value)
        raw = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert raw.status_code == 429 and raw.json()["error"]["code"] == "overloaded"
    finally:
        assert admin.post("/admin/plugins", content=wasm, headers={"Content-Type": "application/wasm"}).status_code == 200
    ok = client.completions.create(model=model, prompt="Let me in", max_tokens=2)
    assert ok.usage.completion_tokens >= 1
