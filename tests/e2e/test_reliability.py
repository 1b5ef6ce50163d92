"""Reliability rounds against a live server: plugin faults under load (trap, deadline, memory
bomb, invalid answers, configure failures) with the `fail` and the `fallback` policy, 10x more
concurrent requests than the batch holds, slow stream readers, and KV-pool exhaustion that
forces preemption. After every round: each request either completed correctly or got a clear
OpenAI-shaped error (none lost, none hung), the page pool is back to full, /health answers,
and the server's memory does not keep growing across rounds.

WEFT_SOAK_ROUNDS (default 1) repeats the rounds: the same file is the soak program
(`scripts/soak.sh`)."""

import asyncio
import json
import os
import random

import httpx

from conftest import metric, wait_idle

ROUNDS = int(os.environ.get("WEFT_SOAK_ROUNDS", "1"))
PROMPTS = ["The early bird", "A penny saved is", "You will meet a tall dark stranger", "Q: What is the meaning of life?\nA:"]
FAULTS = ["trap", "loop", "memory", "bad-token", "configure-trap"]


class Tally:
    def __init__(self):
        self.sent = self.completed = self.errored = self.lost = 0
        self.faults_injected = self.faults_contained = 0
        self.problems = []

    def outcome(self, ok, clear_error, what):
        self.sent += 1
        if ok:
            self.completed += 1
        elif clear_error:
            self.errored += 1
        else:
            self.lost += 1
            self.problems.append(what)


def rss_kib():
    pid = os.environ.get("WEFT_SERVER_PID")
    if not pid:
        return None
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def is_clear_error(r):
    try:
        e = r.json()["error"]
        return r.status_code >= 400 and isinstance(e["message"], str) and len(e["message"]) > 0
    except Exception:
        return False


async def complete(c, body):
    """(response or None, exception text or None); never raises."""
    try:
        return await c.post("/v1/completions", json=body), None
    except Exception as e:  # a dropped connection or a timeout is a lost request
        return None, f"{type(e).__name__}: {e}"


async def reference(c, model, prompt, n):
    r = await c.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


async def faults_round(url, model, admin, plugin_dir, tally, refs):
    """Faulty sampler requests mixed with normal ones: the normal ones are untouched."""
    faulty = open(f"{plugin_dir}/weft_test_faulty.wasm", "rb").read()
    assert admin.post("/admin/plugins", content=faulty, headers={"Content-Type": "application/wasm"}).status_code == 200
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        for policy in ["fail", "fallback"]:
            r = admin.put("/admin/plugins/sampler/faulty/policy", json={"policy": policy})
            assert r.status_code == 200, r.text
            normal = [(p, 8 + 4 * (i % 3)) for i, p in enumerate(PROMPTS * 3)]
            for key in normal:
                if key not in refs:
                    refs[key] = await reference(c, model, *key)
            jobs = [complete(c, {"model": model, "prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True}) for p, n in normal]
            jobs += [complete(c, {"model": model, "prompt": "Tell me a story", "max_tokens": 6, "sampler": "faulty", "fault": f, "ignore_eos": True}) for f in FAULTS * 2]
            out = await asyncio.gather(*jobs)
            for (p, n), (r, exc) in zip(normal, out[: len(normal)]):
                ok = r is not None and r.status_code == 200 and r.json()["choices"][0]["text"] == refs[(p, n)]
                tally.outcome(ok, False, f"normal request next to faults ({policy}): {exc or (r.status_code, r.text[:200])}")
            for f, (r, exc) in zip(FAULTS * 2, out[len(normal) :]):
                tally.faults_injected += 1
                if policy == "fallback":
                    # contained: the built-in sampler took over, the request completed
                    ok = r is not None and r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
                    tally.outcome(ok, False, f"{f} under fallback: {exc or (r.status_code, r.text[:200])}")
                    tally.faults_contained += ok
                else:
                    # contained: a clear error naming what failed, and nothing else disturbed
                    clear = r is not None and is_clear_error(r)
                    tally.outcome(False, clear, f"{f} under {policy}: {exc or (r.status_code, r.text[:200])}")
                    tally.faults_contained += clear
    assert admin.put("/admin/plugins/sampler/faulty/policy", json={"policy": "fail"}).status_code == 200


async def overload_round(url, model, tally, n):
    """n concurrent requests (10x --max-sequences): each completes or is refused clearly."""
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=n)) as c:
        out = await asyncio.gather(*(complete(c, {"model": model, "prompt": PROMPTS[i % 4] + f" {i}", "max_tokens": 2, "temperature": 0, "ignore_eos": True}) for i in range(n)))
    refused = 0
    for r, exc in out:
        ok = r is not None and r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        clear = r is not None and r.status_code in (429, 503) and is_clear_error(r)
        refused += clear
        tally.outcome(ok, clear, f"overload: {exc or (r.status_code, r.text[:200])}")
    return refused


async def slow_readers_round(url, model, tally, refs):
    """Streams read one chunk every 0.1 s while other requests run: identical text."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:

        async def slow(p, n):
            text = ""
            try:
                async with c.stream("POST", "/v1/completions", json={"model": model, "prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}) as r:
                    async for line in r.aiter_lines():
                        await asyncio.sleep(0.1)
                        if line.startswith("data: {"):
                            ch = json.loads(line[6:])["choices"]
                            text += ch[0]["text"] if ch else ""
                return text, None
            except Exception as e:
                return None, str(e)

        keys = [(p, 12) for p in PROMPTS]
        for k in keys:
            if k not in refs:
                refs[k] = await reference(c, model, *k)
        out = await asyncio.gather(*(slow(*k) for k in keys), *(complete(c, {"model": model, "prompt": p, "max_tokens": 16, "temperature": 0.8, "seed": 1}) for p in PROMPTS * 2))
        for k, (text, exc) in zip(keys, out[: len(keys)]):
            tally.outcome(text == refs[k], False, f"slow reader: {exc or (text, refs[k])}")
        for r, exc in out[len(keys) :]:
            tally.outcome(r is not None and r.status_code == 200, False, f"next to slow readers: {exc}")


async def exhaustion_round(url, model, admin, tally, total_pages, page_size):
    """More KV demand than the pool holds: requests are preempted and recomputed, and still
    produce exactly their solo greedy output."""
    rng = random.Random(7)
    # Admission reserves a prompt's pages plus its first token's, so the pool fills with
    # admitted prompts; their second page of generated tokens is what it cannot give.
    prompt_len, out_len = 1000, 40
    per_seq = (prompt_len + 1 + page_size - 1) // page_size
    n_req = total_pages // per_seq + 1
    prompts = [[rng.randrange(100, 2000) for _ in range(prompt_len)] for _ in range(n_req)]
    before = admin.get("/admin/engine").json()["preemptions"]
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        out = await asyncio.gather(*(complete(c, {"model": model, "prompt": p, "max_tokens": out_len, "temperature": 0, "ignore_eos": True}) for p in prompts))
        solo = [await reference(c, model, p, out_len) for p in prompts[:2]]
    preempted = admin.get("/admin/engine").json()["preemptions"] - before
    for i, (r, exc) in enumerate(out):
        ok = r is not None and r.status_code == 200 and r.json()["usage"]["completion_tokens"] == out_len
        if ok and i < 2:
            ok = r.json()["choices"][0]["text"] == solo[i]
        clear = r is not None and r.status_code in (413, 429, 503) and is_clear_error(r)
        tally.outcome(ok, clear, f"exhaustion: {exc or (r.status_code, r.text[:200])}")
    return preempted


def test_reliability_rounds(url, model, admin, http, plugin_dir):
    start = wait_idle(admin)
    total = start["kv_pages"]["total"]
    tally, refs, rss, refused, preempted = Tally(), {}, [], 0, 0
    for rnd in range(ROUNDS):
        for name, run in [
            ("faults", lambda: faults_round(url, model, admin, plugin_dir, tally, refs)),
            ("overload", lambda: overload_round(url, model, tally, 640)),
            ("slow readers", lambda: slow_readers_round(url, model, tally, refs)),
            ("exhaustion", lambda: exhaustion_round(url, model, admin, tally, total, 64)),
        ]:
            got = asyncio.run(run())
            if name == "overload":
                refused += got
            if name == "exhaustion":
                preempted += got
            idle = wait_idle(admin, timeout=120)
            assert idle["kv_pages"]["free"] == total, f"round {rnd} {name}: pages leaked: {idle['kv_pages']}"
            assert http.get("/health").status_code == 200, f"round {rnd} {name}: /health"
        rss.append(rss_kib())
    faults_metric = metric(http.get("/metrics").text, "weft_plugin_events_total", kind="sampler", name="faulty", version="0.1.0", what="faults")
    summary = (
        f"\nreliability, {ROUNDS} round(s): {tally.sent} requests sent, {tally.completed} completed, {tally.errored} clear errors "
        f"({refused} refused under overload), {tally.lost} lost; pages leaked {total - idle['kv_pages']['free']}; "
        f"faults injected {tally.faults_injected}, contained {tally.faults_contained} (plugin fault counter {faults_metric}); "
        f"preemptions {preempted}; server RSS per round (KiB) {rss}"
    )
    print(summary)
    assert tally.lost == 0, "\n".join(tally.problems[:20])
    assert tally.faults_contained == tally.faults_injected
    assert faults_metric and faults_metric > 0
    assert preempted > 0, "the exhaustion round did not exhaust the pool"
    if len(rss) >= 3 and rss[0]:
        # allocator warm-up in round 1; after that the footprint must not keep growing
        assert rss[-1] - rss[1] < 64 * 1024, f"server memory grew across rounds: {rss}"
