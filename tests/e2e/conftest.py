"""Fixtures for the end-to-end tests of a running `weft serve`.

The Rust harness (runtime/cli/tests/openai_e2e.rs) starts the server and sets:
  WEFT_URL           base URL, e.g. http://127.0.0.1:8123
  WEFT_ADMIN_TOKEN   the server's admin token
  WEFT_MODEL         the served model name
  WEFT_PLUGIN_DIR    where the build put the test plugins (*.wasm)
  WEFT_GREEDY_REF    JSON file: `weft generate --json` outputs to compare against
To run them by hand against your own server, set the same variables.
"""

import json
import os

import httpx
import openai
import pytest


def _env(name):
    v = os.environ.get(name)
    if not v:
        pytest.exit(f"{name} is not set; run these tests through `cargo test -p weft --test openai_e2e`", returncode=2)
    return v


@pytest.fixture(scope="session")
def url():
    return _env("WEFT_URL").rstrip("/")


@pytest.fixture(scope="session")
def model():
    return _env("WEFT_MODEL")


@pytest.fixture(scope="session")
def admin_token():
    return _env("WEFT_ADMIN_TOKEN")


@pytest.fixture(scope="session")
def plugin_dir():
    return _env("WEFT_PLUGIN_DIR")


@pytest.fixture(scope="session")
def greedy_ref():
    with open(_env("WEFT_GREEDY_REF")) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_client_factory(url):
    """A new AsyncOpenAI per event loop (a client is bound to the loop it first ran on)."""
    return lambda: openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(url):
    with httpx.Client(base_url=url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def admin(url, admin_token):
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {admin_token}"}) as c:
        yield c


def metric(text, metric_name, **labels):
    """The value of one sample in a Prometheus text exposition (None when absent)."""
    name = metric_name
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head == name and not labels:
            return float(value)
        if head.startswith(name + "{"):
            got = ",".join(sorted(head[len(name) + 1 : -1].split(",")))
            if got == want:
                return float(value)
    return None


def wait_idle(http, timeout=60.0):
    """Waits until the engine has nothing running or waiting; returns its counters."""
    import time

    deadline = time.time() + timeout
    while True:
        e = http.get("/admin/engine").json()
        if e["running"] == 0 and e["waiting"] == 0:
            return e
        if time.time() > deadline:
            raise AssertionError(f"engine still busy after {timeout}s: {e}")
        time.sleep(0.05)
