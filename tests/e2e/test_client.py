"""libwafer-client through `wafer client` and the example programs: against a real wafer serve (stories260K:
the texts equal what the HTTP API answers), and against a faulty stand-in (faulty_openai.py): 429 with
Retry-After, 503, resets, a slow first byte, streams that break, connection reuse."""
import json
import os
import subprocess
import time

import pytest

from conftest import STORIES, WAFER_BIN, need
from faulty_openai import FaultyServer

EXAMPLES = os.path.join(os.path.dirname(WAFER_BIN), "examples")


def client(*args, url=None, timeout=30):
    cmd = [WAFER_BIN, "client"] + (["--url", url] if url else []) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def example(name):
    path = os.path.join(EXAMPLES, name)
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (run make examples)")
    return path


@pytest.fixture
def faulty():
    s = FaultyServer()
    yield s
    s.close()


# ---------------------------------------------------------------- against wafer serve


def completion(server, prompt, n=12):
    r = server.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0})
    assert r.status_code == 200
    return r.json()["choices"][0]["text"]


def test_generate_stream_and_chat(stories_server):
    s = stories_server
    want = completion(s, "Once upon a time")
    r = client("-n", "12", "--temperature", "0", "generate", "Once upon a time", url=s.base)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + "\n"
    r = client("-n", "12", "--temperature", "0", "--stream", "generate", "Once upon a time", url=s.base)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + "\n"
    r = client("-n", "12", "--temperature", "0", "--stream", "--json", "generate", "Once upon a time", url=s.base)
    j = json.loads(r.stdout)
    assert j["text"] == want and j["status"] == "ok" and j["attempts"] == 1
    assert j["completion_tokens"] == 12 and j["prompt_tokens"] > 0 and j["finish_reason"] == "length"
    # /v1 on the URL is accepted too
    r = client("-n", "12", "--temperature", "0", "generate", "Once upon a time", url=s.base + "/v1/")
    assert r.stdout == want + "\n"

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell a story"}]
    h = s.client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 10, "temperature": 0})
    assert h.status_code == 200
    r = client("-n", "10", "--temperature", "0", "--json", "--system", "Be brief.", "chat", "Tell a story",
               url=s.base)
    j = json.loads(r.stdout)
    assert j["status"] == "ok" and j["text"] == h.json()["choices"][0]["message"]["content"]
    r = client("-n", "10", "--temperature", "0", "--stream", "--system", "Be brief.", "chat", "Tell a story",
               url=s.base)
    assert r.stdout == h.json()["choices"][0]["message"]["content"] + "\n"
    r = client("get", "/ready", url=s.base)
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "ready"


def test_batch_in_order(stories_server):
    s = stories_server
    prompts = ["Once upon a time", "The cat", "Lily and Tom", "One day", "The sun was"]
    want = [completion(s, p) for p in prompts]
    r = client("-n", "12", "--temperature", "0", "--json", "-c", "3", "batch", *prompts, url=s.base)
    assert r.returncode == 0, r.stderr
    got = [json.loads(l) for l in r.stdout.splitlines()]
    assert [g["index"] for g in got] == list(range(5))
    assert [g["text"] for g in got] == want


def test_examples(stories_server):
    s = stories_server
    want = completion(s, "Once upon a time", 16)
    r = subprocess.run([example("generate"), s.base, "Once upon a time"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want + "\n---\n" + want + "\n"
    assert "completion tokens 16" in r.stderr
    prompts = ["Once upon a time", "The dog", "A little girl", "The sky"]
    want = [completion(s, p) for p in prompts]
    r = subprocess.run([example("batch"), s.base] + prompts, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = "".join("%d: %s\n" % (i, t) for i, t in enumerate(want))
    assert r.stdout == "batch_generate:\n" + lines + "threads:\n" + lines


def test_api_key(make_server):
    s = make_server(STORIES, "--api-key", "sk-test")
    r = client("-n", "4", "generate", "Once", url=s.base)
    assert r.returncode == 1 and "HTTP 401" in r.stderr and "API key" in r.stderr
    r = client("-n", "4", "--api-key", "sk-test", "--json", "generate", "Once", url=s.base)
    j = json.loads(r.stdout)
    assert r.returncode == 0 and j["status"] == "ok" and j["attempts"] == 1


# ---------------------------------------------------------------- against the faulty stand-in


def run_timed(*args):
    t0 = time.monotonic()
    r = client(*args)
    return r, time.monotonic() - t0


def test_retry_after_is_honoured(faulty):
    url = faulty.url("429ra1,ok")
    r, dt = run_timed("--url", url, "--json", "-v", "generate", "hi")
    j = json.loads(r.stdout)
    assert r.returncode == 0 and j["status"] == "ok" and j["text"] == "hello world" and j["attempts"] == 2
    assert "HTTP 429" in r.stderr and "attempt 2 in 1.00 s" in r.stderr
    reqs = faulty.requests("429ra1,ok")
    gap = reqs[1]["t"] - reqs[0]["t"]
    assert 0.95 <= gap < 1.6, gap  # Retry-After: 1, not the 0.5 s backoff
    r, dt = run_timed("--url", faulty.url("429ms300,ok"), "--json", "generate", "hi")
    assert json.loads(r.stdout)["attempts"] == 2
    reqs = faulty.requests("429ms300,ok")
    assert 0.28 <= reqs[1]["t"] - reqs[0]["t"] < 0.5


def test_503_backoff_then_give_up(faulty):
    r, dt = run_timed("--url", faulty.url("503"), "--json", "generate", "hi")
    j = json.loads(r.stdout)
    assert r.returncode == 1 and j["status"] == "http" and j["http_status"] == 503 and j["attempts"] == 3
    assert "HTTP 503: step 503 (after 3 attempts)" in r.stderr
    t = [x["t"] for x in faulty.requests("503")]
    assert len(t) == 3
    assert 0.375 - 0.02 <= t[1] - t[0] <= 0.5 + 0.15  # 0.5 s * (1 - 0.25 * rand)
    assert 0.75 - 0.02 <= t[2] - t[1] <= 1.0 + 0.15   # 1 s * (1 - 0.25 * rand)
    r = client("--url", faulty.url("503"), "--retries", "0", "--json", "generate", "hi")
    assert json.loads(r.stdout)["attempts"] == 1


def test_no_retry_on_400_or_should_not(faulty):
    r = client("--url", faulty.url("400"), "--json", "generate", "hi")
    j = json.loads(r.stdout)
    assert r.returncode == 1 and j["attempts"] == 1 and j["http_status"] == 400 and "step 400" in j["error"]
    r = client("--url", faulty.url("shouldnot"), "--json", "generate", "hi")
    assert json.loads(r.stdout)["attempts"] == 1


def test_connection_reset_is_retried(faulty):
    r = client("--url", faulty.url("reset,ok"), "--json", "generate", "hi")
    j = json.loads(r.stdout)
    assert r.returncode == 0 and j["attempts"] == 2 and j["text"] == "hello world"
    r = client("--url", faulty.url("reset"), "--json", "--retries", "1", "generate", "hi")
    j = json.loads(r.stdout)
    assert r.returncode == 1 and j["status"] == "connect" and j["attempts"] == 2


def test_refused_connection(faulty):
    port = faulty.server_address[1]
    faulty.close()
    r, dt = run_timed("--url", "http://127.0.0.1:%d" % port, "--json", "generate", "hi")
    j = json.loads(r.stdout)
    assert r.returncode == 1 and j["status"] == "connect" and j["attempts"] == 3 and dt < 5


def test_first_byte_timeout(faulty):
    r, dt = run_timed("--url", faulty.url("slow3"), "--first-byte-timeout", "0.3", "--retries", "1", "--json",
                      "generate", "hi")
    j = json.loads(r.stdout)
    assert r.returncode == 1 and j["status"] == "timeout" and j["attempts"] == 2
    assert "first-byte timeout" in j["error"]
    assert dt < 2.5  # 0.3 + backoff <= 0.5 + 0.3, not the server's 3 s
    r = client("--url", faulty.url("slow1,ok"), "--first-byte-timeout", "0.3", "--json", "generate", "hi")
    assert json.loads(r.stdout)["attempts"] == 2
    # the total timeout of one attempt
    r, dt = run_timed("--url", faulty.url("slow3"), "--timeout", "0.4", "--retries", "0", "--json", "generate", "hi")
    assert json.loads(r.stdout)["status"] == "timeout" and dt < 2.5


def test_stream_never_retried_once_begun(faulty):
    r = client("--url", faulty.url("cut,ok"), "--stream", "generate", "hi")
    assert r.returncode == 1
    assert r.stdout == "hello\n"  # what arrived before the cut was shown
    assert "stream broke" in r.stderr or "before data: [DONE]" in r.stderr
    assert len(faulty.requests("cut,ok")) == 1
    r = client("--url", faulty.url("errorevent"), "--stream", "--json", "generate", "hi")
    j = json.loads(r.stdout)
    assert j["status"] == "stream" and "the engine failed" in j["error"] and j["text"] == "hello"
    # a stream that had not begun is retried like any request
    r = client("--url", faulty.url("503,ok"), "--stream", "--json", "chat", "hi")
    j = json.loads(r.stdout)
    assert j["status"] == "ok" and j["text"] == "hello world" and j["attempts"] == 2
    assert j["prompt_tokens"] == 3 and j["completion_tokens"] == 2 and j["finish_reason"] == "stop"


def test_batch_items_fail_alone_and_connections_are_reused(faulty):
    # one script per prompt is not possible through one URL, so: a script where requests 1 and 2 fail
    r = client("--url", faulty.url("ok,400,400,ok"), "--json", "-c", "1", "batch", "a", "b", "c", "d")
    got = [json.loads(l) for l in r.stdout.splitlines()]
    assert r.returncode == 1
    assert [g["status"] for g in got] == ["ok", "http", "http", "ok"]
    # one connection at a time: every request went over the same kept-alive connection
    r = client("--url", faulty.url("ok"), "--json", "-c", "1", "batch", "a", "b", "c", "d", "e")
    assert r.returncode == 0
    assert len({x["port"] for x in faulty.requests("ok")}) == 1
    r = client("--url", faulty.url("ok"), "--json", "-c", "2", "batch", *"abcdefgh")
    assert len({x["port"] for x in faulty.requests("ok")}) <= 3
    # the bodies are what the OpenAI API defines
    body = faulty.requests("ok")[-1]["body"]
    assert body["prompt"] in "abcdefgh" and "stream" not in body


def test_request_fields(faulty):
    r = client("--url", faulty.url("ok"), "-m", "tiny", "-n", "7", "--temperature", "0.5", "--top-p", "0.9",
               "--seed", "42", "--stop", "x", "--stop", "y", "--extra", '{"top_k": 3}', "--stream", "generate", "p")
    assert r.returncode == 0, r.stderr
    b = faulty.requests("ok")[-1]["body"]
    assert b == {"model": "tiny", "prompt": "p", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 42,
                 "stop": ["x", "y"], "top_k": 3, "stream": True, "stream_options": {"include_usage": True}}
    r = client("--url", faulty.url("ok"), "--extra", "[1]", "generate", "p")
    assert r.returncode == 1 and "extra_json is not a JSON object" in r.stderr
    r = client("--url", "ftp://x", "generate", "p")
    assert r.returncode == 2 and "http://" in r.stderr
