"""64 concurrent streaming requests with random lengths and random client disconnects, and a
sampler plugin swap in the middle. Every surviving request must be exactly what the plugin
version it was bound to produces, and the KV page pool must return to its initial free count."""

import asyncio
import random
import time

from conftest import wait_idle

PROMPTS = [
    "The early bird",
    "A penny saved is",
    "You will meet a tall dark stranger",
    "Q: What is the meaning of life?\nA:",
    "Never trust a computer you can't throw out a window.",
]


async def one(async_client, model, i, rng, swap_times, results, started, swapped):
    prompt = PROMPTS[i % len(PROMPTS)]
    max_tokens = rng.randint(4, 48)
    disconnect_after = rng.choice([None, None, None, 0, 1, 3, 8])
    delay = rng.random() * 0.5
    if i >= 40:
        await swapped.wait()  # these start after the swap; the others before or during it
    await asyncio.sleep(delay)
    t_submit = time.perf_counter()
    stream = await async_client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True}, extra_body={"sampler": "swap", "ignore_eos": True})
    t_first = time.perf_counter()  # the request was queued before the response started
    started.append(i)
    text, chunks, usage, finish = "", 0, None, None
    async for c in stream:
        if c.choices:
            text += c.choices[0].text
            finish = c.choices[0].finish_reason or finish
            chunks += 1
        if c.usage:
            usage = c.usage
        if disconnect_after is not None and chunks >= disconnect_after and finish is None:
            await stream.close()
            results.append(dict(i=i, disconnected=True))
            return
    if swap_times["end"] is not None and t_submit > swap_times["end"]:
        version = "2.0.0"
    elif swap_times["start"] is None or t_first < swap_times["start"]:
        version = "1.0.0"
    else:
        version = None  # raced with the swap: either version is right
    results.append(dict(i=i, disconnected=False, prompt=prompt, max_tokens=max_tokens, text=text, usage=usage, finish=finish, version=version))


async def storm(new_client, admin, model, plugin_dir):
    async_client = new_client()
    rng = random.Random(20261202)
    swap_times = {"start": None, "end": None}
    results, started, swapped = [], [], asyncio.Event()
    tasks = [asyncio.create_task(one(async_client, model, i, rng, swap_times, results, started, swapped)) for i in range(64)]
    while len(started) < 12:  # swap while requests are in flight
        await asyncio.sleep(0.01)
    swap_times["start"] = time.perf_counter()
    v2 = open(f"{plugin_dir}/weft_test_swap_v2.wasm", "rb").read()
    r = await asyncio.to_thread(admin.post, "/admin/plugins", content=v2, headers={"Content-Type": "application/wasm"})
    swap_times["end"] = time.perf_counter()
    swapped.set()
    assert r.status_code == 200, r.text
    await asyncio.gather(*tasks)
    return results


async def reference(async_client, model, prompt, max_tokens):
    r = await async_client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body={"sampler": "swap", "ignore_eos": True})
    return r.choices[0].text


def test_64_streams_with_disconnects_and_a_plugin_swap(async_client_factory, admin, model, plugin_dir):
    before = wait_idle(admin)
    total = before["kv_pages"]["total"]
    # Start from swap@1.0.0 active (the admin test may have left 2.0.0 active).
    v1 = open(f"{plugin_dir}/weft_test_swap_v1.wasm", "rb").read()
    assert admin.post("/admin/plugins", content=v1, headers={"Content-Type": "application/wasm"}).status_code == 200
    assert admin.post("/admin/plugins/sampler/swap/activate", json={"version": "1.0.0"}).status_code == 200

    results = asyncio.run(storm(async_client_factory, admin, model, plugin_dir))
    survivors = [r for r in results if not r["disconnected"]]
    gone = len(results) - len(survivors)
    assert len(results) == 64 and gone >= 10 and len(survivors) >= 30, (gone, len(survivors))

    after = wait_idle(admin)
    assert after["kv_pages"]["free"] == total, f"pages leaked: {after}"
    assert after["aborted"] >= before["aborted"] + 1

    # What each version produces, computed now, one version at a time (batching does not
    # change results on this backend, so these are exact references).
    need = {(r["prompt"], r["max_tokens"]) for r in survivors}

    async def refs():
        c = async_client_factory()
        return dict(zip(need, await asyncio.gather(*(reference(c, model, p, m) for p, m in need))))

    ref = {}
    assert admin.post("/admin/plugins/sampler/swap/activate", json={"version": "1.0.0"}).status_code == 200
    ref["1.0.0"] = asyncio.run(refs())
    assert admin.post("/admin/plugins/sampler/swap/activate", json={"version": "2.0.0"}).status_code == 200
    ref["2.0.0"] = asyncio.run(refs())
    by_version = {"1.0.0": 0, "2.0.0": 0, None: 0}
    for r in survivors:
        key = (r["prompt"], r["max_tokens"])
        assert r["finish"] == "length" and r["usage"].completion_tokens == r["max_tokens"], r
        allowed = [r["version"]] if r["version"] else ["1.0.0", "2.0.0"]
        assert any(r["text"] == ref[v][key] for v in allowed), (r, {v: ref[v][key] for v in allowed})
        by_version[r["version"]] += 1
    assert by_version["1.0.0"] > 0 and by_version["2.0.0"] > 0, by_version
    assert ref["1.0.0"] != ref["2.0.0"]
    print(f"\n64 streams: {len(survivors)} completed ({by_version}), {gone} disconnected; pool {after['kv_pages']['free']}/{total} free")
    wait_idle(admin)
    assert admin.get("/admin/engine").json()["kv_pages"]["free"] == total
