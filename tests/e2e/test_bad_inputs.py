"""Every kind of bad input gets the right status and a message naming the problem, and the
server stays healthy after each."""

import json

import pytest

C = "/v1/completions"
CHAT = "/v1/chat/completions"
OK = {"prompt": "hello", "max_tokens": 2}
MSG = [{"role": "user", "content": "hi"}]

# (case, path, body (dict → JSON, bytes → raw), status, message fragment, param)
CASES = [
    ("malformed JSON", C, b'{"prompt": "hi", ', 400, "not valid JSON", None),
    ("empty body", C, b"", 400, "empty", None),
    ("not an object", C, b"[1, 2, 3]", 400, "JSON object", None),
    ("max_tokens wrong type", C, {**OK, "max_tokens": "ten"}, 400, "max_tokens", "max_tokens"),
    ("temperature wrong type", C, {**OK, "temperature": "hot"}, 400, "temperature", "temperature"),
    ("messages wrong type", CHAT, {"messages": "hello"}, 400, "messages", "messages"),
    ("content wrong type", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "messages[0].content"),
    ("missing messages", CHAT, {"model": "x"}, 400, "messages", None),
    ("seed wrong type", C, {**OK, "seed": "abc"}, 400, "seed", "seed"),
    ("temperature negative", C, {**OK, "temperature": -1}, 400, "temperature", "temperature"),
    ("top_p zero", C, {**OK, "top_p": 0}, 400, "top_p", "top_p"),
    ("top_p above one", CHAT, {"messages": MSG, "top_p": 1.5}, 400, "top_p", "top_p"),
    ("top_k negative", C, {**OK, "top_k": -2}, 400, "top_k", "top_k"),
    ("min_p above one", C, {**OK, "min_p": 2}, 400, "min_p", "min_p"),
    ("repetition_penalty zero", C, {**OK, "repetition_penalty": 0}, 400, "repetition_penalty", "repetition_penalty"),
    ("presence_penalty too big", C, {**OK, "presence_penalty": 3}, 400, "presence_penalty", "presence_penalty"),
    ("frequency_penalty too small", CHAT, {"messages": MSG, "frequency_penalty": -3}, 400, "frequency_penalty", "frequency_penalty"),
    ("n zero", C, {**OK, "n": 0}, 400, "`n`", "n"),
    ("n huge", C, {**OK, "n": 1000}, 400, "`n`", "n"),
    ("max_tokens zero", C, {**OK, "max_tokens": 0}, 400, "max_tokens", "max_tokens"),
    ("max_tokens negative", CHAT, {"messages": MSG, "max_tokens": -5}, 400, "max_tokens", "max_tokens"),
    ("logprobs too many", C, {**OK, "logprobs": 50}, 400, "logprobs", "logprobs"),
    ("top_logprobs too many", CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 30}, 400, "top_logprobs", "top_logprobs"),
    ("top_logprobs without logprobs", CHAT, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs", "top_logprobs"),
    ("logit_bias bad key", C, {**OK, "logit_bias": {"abc": 1}}, 400, "logit_bias", "logit_bias"),
    ("logit_bias out of range", C, {**OK, "logit_bias": {"5": 500}}, 400, "logit_bias", "logit_bias"),
    ("logit_bias unknown token", C, {**OK, "logit_bias": {"999999": 1}}, 400, "vocabulary", "logit_bias"),
    ("too many stop strings", C, {**OK, "stop": [str(i) for i in range(20)]}, 400, "stop", "stop"),
    ("empty stop string", C, {**OK, "stop": [""]}, 400, "stop", "stop"),
    ("stop wrong type", C, {**OK, "stop": 5}, 400, "stop", "stop"),
    ("best_of above n", C, {**OK, "best_of": 3}, 400, "best_of", "best_of"),
    ("echo with logprobs", C, {**OK, "echo": True, "logprobs": 1}, 400, "echo", "echo"),
    ("stream_options without stream", C, {**OK, "stream_options": {"include_usage": True}}, 400, "stream_options", "stream_options"),
    ("suffix", C, {**OK, "suffix": "end"}, 400, "suffix", "suffix"),
    ("unknown model", C, {**OK, "model": "gpt-17"}, 404, "does not exist", "model"),
    ("unknown model chat", CHAT, {"model": "gpt-17", "messages": MSG}, 404, "does not exist", "model"),
    ("missing prompt", C, {"max_tokens": 2}, 400, "prompt", "prompt"),
    ("empty prompt", C, {"prompt": ""}, 400, "empty", "prompt"),
    ("empty prompt list", C, {"prompt": []}, 400, "empty", "prompt"),
    ("empty token list", C, {"prompt": [[]]}, 400, "empty", "prompt"),
    ("mixed prompt list", C, {"prompt": ["a", 5]}, 400, "prompt", "prompt"),
    ("prompt wrong type", C, {"prompt": {"text": "hi"}}, 400, "prompt", "prompt"),
    ("empty messages", CHAT, {"messages": []}, 400, "empty", "messages"),
    ("unknown role", CHAT, {"messages": [{"role": "tool", "content": "x"}]}, 400, "role", "messages[0].role"),
    ("image part", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "text parts", "messages[0].content[0]"),
    ("tools", CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", "tools"),
    ("json mode", CHAT, {"messages": MSG, "response_format": {"type": "json_object"}}, 400, "response_format", "response_format"),
    ("prompt over context", C, {"prompt": [1] * 2100, "max_tokens": 1}, 400, "context length", "prompt"),
    ("prompt + max_tokens over context", C, {"prompt": "hi", "max_tokens": 5000}, 400, "context length", "max_tokens"),
    ("chat max_completion_tokens over context", CHAT, {"messages": MSG, "max_completion_tokens": 5000}, 400, "context length", "max_completion_tokens"),
    ("oversize body", C, {"prompt": "x" * (5 << 20)}, 413, "limit", None),
    ("token id outside vocabulary", C, {"prompt": [1, 99999]}, 400, "vocabulary", "prompt"),
    ("negative token id", C, {"prompt": [-1, 2]}, 400, "vocabulary", "prompt"),
    ("stop_token_ids outside vocabulary", C, {**OK, "stop_token_ids": [99999]}, 400, "vocabulary", "stop_token_ids"),
    ("unknown sampler", C, {**OK, "sampler": "no-such-sampler"}, 400, "no-such-sampler", "sampler"),
    ("unknown sampler chat", CHAT, {"messages": MSG, "sampler": "no-such-sampler"}, 400, "no-such-sampler", "sampler"),
]


@pytest.mark.parametrize("case,path,body,status,fragment,param", CASES, ids=[c[0] for c in CASES])
def test_bad_input(http, case, path, body, status, fragment, param):
    if isinstance(body, dict):
        r = http.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    else:
        r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, f"{case}: {r.status_code} {r.text[:300]}"
    err = r.json()["error"]
    assert fragment.lower() in err["message"].lower(), f"{case}: {err}"
    assert err["type"] in ("invalid_request_error", "not_found_error")
    if param is not None:
        assert err["param"] == param, f"{case}: {err}"
    h = http.get("/health")
    assert h.status_code == 200, f"unhealthy after {case}"


def test_routes_and_methods(http):
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = http.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_server_still_serves_after_the_table(client, model):
    r = client.completions.create(model=model, prompt="Still here?", max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
