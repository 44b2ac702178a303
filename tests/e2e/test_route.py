"""End-to-end tests of `wafer route`: real `wafer serve` backends and faulty stand-ins (route_standin.py) on
loopback, the router started from a YAML file on a free port. Every test keeps a hard bound on its time
(client timeouts, small configs), well under 30 s."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

import httpx
import pytest

from conftest import STORIES, WAFER_BIN, need
from route_standin import Standin, generate, text_of


class Router:
    """One wafer route process on a free port, configured by a YAML file it can be told to reload."""

    def __init__(self, yaml_text, *args, wait_ready=True, timeout=15):
        self.dir = tempfile.mkdtemp(prefix="wafer-route-")
        self.cfg = os.path.join(self.dir, "route.yaml")
        with open(self.cfg, "w") as f:
            f.write(yaml_text)
        self.log_path = os.path.join(self.dir, "route.log")
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen([WAFER_BIN, "route", "--config", self.cfg, "--port", "0", *args],
                                     stdout=self.log_file, stderr=subprocess.STDOUT)
        self.base = None
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(r"listening on (http://[\d.]+:\d+)", self.log())
            if m:
                self.base = m.group(1)
                break
            if self.proc.poll() is not None:
                raise RuntimeError("wafer route exited with %d:\n%s" % (self.proc.returncode, self.log()))
            time.sleep(0.02)
        if not self.base:
            self.kill()
            raise RuntimeError("wafer route did not start:\n" + self.log())
        self.client = httpx.Client(base_url=self.base, timeout=20)
        if wait_ready:
            while time.time() < deadline:
                try:
                    if httpx.get(self.base + "/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)
            else:
                raise RuntimeError("wafer route never became ready:\n" + self.log())

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def metrics(self):
        out = {}
        for line in httpx.get(self.base + "/metrics", timeout=5).text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def reload(self, yaml_text, timeout=10):
        n = self.log().count("config reloaded")
        with open(self.cfg, "w") as f:
            f.write(yaml_text)
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + timeout
        while self.log().count("config reloaded") == n:
            assert time.time() < deadline, "the reload did not happen:\n" + self.log()[-2000:]
            time.sleep(0.02)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError("wafer route did not stop on SIGTERM:\n" + self.log()[-3000:])
        self.client.close()
        self.log_file.close()
        return self.proc.returncode


@pytest.fixture
def router():
    made = []

    def make(yaml_text, *args, **kw):
        r = Router(yaml_text, *args, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        try:
            assert r.stop() == 0, r.log()[-3000:]
        finally:
            r.kill()


@pytest.fixture
def standin():
    made = []

    def make(*args, **kw):
        s = Standin(*args, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def pools_yaml(pools, kind="wafer"):
    out = "pools:\n"
    for name, urls in pools.items():
        out += "  - name: %s\n    kind: %s\n    backends: [%s]\n" % (name, kind, ", ".join(urls))
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def sse_events(resp):
    """The data payloads of an SSE response, in order ("[DONE]" included). Reads it as it arrives (httpx
    0.23's iter_lines keeps a newline at some chunk boundaries, so events are split here)."""
    out, buf = [], ""
    for text in resp.iter_text():
        buf += text
        while "\n\n" in buf:
            block, buf = buf.split("\n\n", 1)
            for line in block.split("\n"):
                if line.startswith("data: "):
                    out.append(line[6:])
    return out


def stream_text(events, chat=False):
    text = ""
    for e in events:
        if e == "[DONE]":
            continue
        o = json.loads(e)
        assert "error" not in o, o
        for c in o["choices"]:
            text += (c["delta"].get("content") or "") if chat else c["text"]
    return text


# ---- 1. the OpenAI-compatible front ------------------------------------------------------------------


def test_proxies_wafer_serve_streaming_and_not(make_server, router):
    a = make_server(STORIES, "--chat-template", "chatml")
    b = make_server(STORIES, "--chat-template", "chatml")
    r = router(pools_yaml({"main": [a.base, b.base]}) + "routes:\n  - {model: '*', pool: main}\n")
    body = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
    direct = a.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    got = r.client.post("/v1/completions", json=body)
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("application/json")
    assert got.json()["choices"][0]["text"] == direct
    assert got.json()["usage"]["completion_tokens"] == 24
    # streamed: the same text, OpenAI chunks, [DONE] last, no router-internal fields
    with r.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        ev = sse_events(s)
    assert ev[-1] == "[DONE]"
    assert stream_text(ev) == direct
    assert all("token_ids" not in e for e in ev)
    assert json.loads(ev[0])["object"] == "text_completion"
    # chat, streamed and not
    chat = {"model": "stories260K", "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": 16, "temperature": 0}
    full = r.client.post("/v1/chat/completions", json=chat).json()
    assert full["object"] == "chat.completion"
    with r.client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as s:
        ev = sse_events(s)
    assert json.loads(ev[0])["choices"][0]["delta"]["role"] == "assistant"
    assert stream_text(ev, chat=True) == full["choices"][0]["message"]["content"]
    # both backends took part (least loaded with random ties), and the log names them
    models = r.client.get("/v1/models").json()
    assert "stories260K" in [m["id"] for m in models["data"]]
    assert re.search(r"route: POST /v1/completions model=stories260K status=200 stream backends=127\.0\.0\.1:\d+\(200\)",
                     r.log())


def test_models_union_and_routing_by_model(standin, router):
    a = standin(models=["alpha", "shared"])
    b = standin(models=["beta", "shared"])
    r = router(pools_yaml({"pa": [a.url], "pb": [b.url]}) +
               "routes:\n  - {model: alpha, pool: pa}\n  - {model: beta, pool: pb}\n  - {model: gamma, pool: pb}\n")
    ids = sorted(m["id"] for m in r.client.get("/v1/models").json()["data"])
    assert ids == ["alpha", "beta", "gamma", "shared"]
    assert r.client.get("/v1/models/beta").json()["id"] == "beta"
    assert r.client.get("/v1/models/nope").status_code == 404
    for model, s in (("alpha", a), ("beta", b), ("gamma", b)):
        n = s.generations()
        resp = r.client.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2})
        assert resp.status_code == 200
        assert s.generations() == n + 1
    # a model no route takes: 404 in OpenAI's shape, nothing sent upstream
    before = a.generations() + b.generations()
    resp = r.client.post("/v1/chat/completions", json={"model": "delta", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 404
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "model_not_found" and err["param"] == "model"
    assert "delta" in err["message"]
    assert a.generations() + b.generations() == before
    # not JSON: 400 from the router itself
    resp = r.client.post("/v1/completions", content=b"{oops")
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
    assert r.client.get("/v1/nothing").status_code == 404
    assert r.client.get("/v1/completions").status_code == 405


def test_all_backends_down_is_503_with_retry_after(router):
    dead = ["http://127.0.0.1:%d" % free_port() for _ in range(2)]
    r = router(pools_yaml({"p": dead}) + "routes:\n  - {model: '*', pool: p}\n"
               "health: {interval_s: 0.2, timeout_ms: 200}\n", wait_ready=False)
    deadline = time.time() + 10
    while r.client.get("/ready").status_code != 503:  # the first checks mark both down
        assert time.time() < deadline
        time.sleep(0.05)
    resp = r.client.post("/v1/completions", json={"model": "m", "prompt": "x"})
    assert resp.status_code == 503
    assert int(resp.headers["retry-after"]) >= 1
    err = resp.json()["error"]
    assert err["code"] == "no_backend_available"
    assert "down" in err["message"] and "'m'" in err["message"]
    assert r.metrics()["wafer_route_no_backend_total"] >= 1


@pytest.mark.parametrize("yaml_text,where", [
    ("pools:\n  - name: a\n    backends: [http://127.0.0.1:1]\nroutes:\n  - {model: m, pool: b}\n", ":5: "),
    ("pools:\n  - name: a\n    backends: [http://127.0.0.1:1]\n    weight: 3\n", ":4: unknown key 'weight'"),
    ("pools:\n  - name: a\n    backends:\n      - https://x:1\n", ":4: pools.backends"),
    ("retries:\n  max: lots\n", ":2: retries.max"),
    ("pools: [\n", ":"),
])
def test_bad_config_names_file_and_line(yaml_text, where, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml_text)
    p = subprocess.run([WAFER_BIN, "route", "--config", str(cfg), "--port", "0"], capture_output=True, text=True,
                       timeout=10)
    assert p.returncode == 2
    assert str(cfg) + where in p.stderr, p.stderr
