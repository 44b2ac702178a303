"""End-to-end tests of `wafer route`: real `wafer serve` backends and faulty stand-ins (route_standin.py) on
loopback, the router started from a YAML file on a free port. Every test keeps a hard bound on its time
(client timeouts, small configs), well under 30 s."""
import http.client
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

    def __init__(self, yaml_text, *args, wait_ready=True, timeout=15, wrap=()):
        self.dir = tempfile.mkdtemp(prefix="wafer-route-")
        self.cfg = os.path.join(self.dir, "route.yaml")
        with open(self.cfg, "w") as f:
            f.write(yaml_text)
        self.log_path = os.path.join(self.dir, "route.log")
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen([*wrap, WAFER_BIN, "route", "--config", self.cfg, "--port", "0", *args],
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


class FastClient:
    """Keep-alive POSTs whose head and body leave in one write. httpx writes them separately, and with
    Nagle on the client and a delayed ACK on the server each small request then waits ~40 ms; http.client
    sends a bytes body together with the head. For tests that send hundreds of requests."""

    def __init__(self, base):
        host, port = base.split("//")[1].split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=20)

    def post(self, path, obj, headers=None):
        body = json.dumps(obj).encode()
        h = {"Content-Type": "application/json", **(headers or {})}
        self.conn.request("POST", path, body=body, headers=h)
        resp = self.conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data

    def close(self):
        self.conn.close()


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


def test_openai_node_client_through_the_router(make_server, router):
    """The official openai npm client, unchanged, through the router (streaming and not, errors)."""
    from test_serve_openai_node import NODE_DIR, ensure_client
    ensure_client()
    s = make_server(STORIES, "--chat-template", "chatml", "--model-alias", "tiny")
    r = router(one_pool([s.base]))
    p = subprocess.run(["node", "openai_client.mjs", r.base], cwd=NODE_DIR, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr + r.log()[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["models"] == ["stories260K", "tiny"]
    assert out["completion"] == out["completion_stream"] and len(out["completion"]) > 10
    assert out["chat"] == out["chat_stream"]
    assert out["error_status"] == 404 and out["error_code"] == "model_not_found"
    assert out["bad_param"] == "max_tokens"


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


# ---- 2. weighted split, sticky, run-time rollout, reload -----------------------------------------------


def completions_200(server):
    return server.metrics().get('wafer_requests_total{endpoint="/v1/completions",status="200"}', 0)


def test_canary_share_on_the_backends_counters(make_server, router):
    stable = make_server(STORIES)
    canary = make_server(STORIES)
    r = router(pools_yaml({"stable": [stable.base], "canary": [canary.base]}) +
               "routes:\n  - model: '*'\n    split: {stable: 90, canary: 10}\n    fallback: [stable]\n")
    s0, c0 = completions_200(stable), completions_200(canary)
    body = {"model": "stories260K", "prompt": "Hi", "max_tokens": 1}
    fc = FastClient(r.base)
    for _ in range(400):
        assert fc.post("/v1/completions", body)[0] == 200
    ds, dc = completions_200(stable) - s0, completions_200(canary) - c0
    # the non-sticky split is a smooth weighted round robin: exactly 10% over 400 requests
    assert (ds, dc) == (360, 40)
    # the rollout grows at run time
    resp = r.client.put("/admin/rollout", json={"model": "*", "split": {"stable": 50, "canary": 50}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["routes"][0]["split"] == {"stable": 50.0, "canary": 50.0}
    for _ in range(100):
        assert fc.post("/v1/completions", body)[0] == 200
    fc.close()
    assert completions_200(canary) - c0 - dc == 50
    assert r.client.get("/admin/rollout").json()["routes"][0]["split"]["canary"] == 50.0
    bad = r.client.put("/admin/rollout", json={"model": "*", "split": {"stable": 1, "nope": 1}})
    assert bad.status_code == 400 and "nope" in bad.json()["error"]["message"]
    assert r.client.put("/admin/rollout", json={"model": "x", "split": {"stable": 1}}).status_code == 404


def test_sticky_split_by_header_and_admin_key(standin, router):
    stable, canary = standin(), standin()
    r = router(pools_yaml({"stable": [stable.url], "canary": [canary.url]}) +
               "routes:\n  - model: '*'\n    split: {stable: 90, canary: 10}\n    sticky: header:X-User-Id\n"
               "server: {admin_key: adm1n}\n")
    body = {"model": "m", "prompt": "x", "max_tokens": 1}
    fc = FastClient(r.base)

    def backend_of(user):
        status, headers, _ = fc.post("/v1/completions", body, {"x-user-id": user})
        assert status == 200
        return headers["x-wafer-backend"]

    first = {u: backend_of("user-%d" % u) for u in range(400)}
    on_canary = {u for u, b in first.items() if b.endswith(":%d" % canary.port)}
    assert 20 <= len(on_canary) <= 60, len(on_canary)  # 10% of 400, within 3 sigma
    for u in range(0, 400, 7):  # the same user, the same pool
        assert backend_of("user-%d" % u) == first[u]
    # growing the canary keeps every canary user there (consistent hashing), and needs the admin key
    grow = {"model": "*", "split": {"stable": 50, "canary": 50}}
    assert r.client.put("/admin/rollout", json=grow).status_code == 401
    assert r.client.put("/admin/rollout", json=grow, headers={"authorization": "Bearer adm1n"}).status_code == 200
    after = {u: backend_of("user-%d" % u) for u in range(400)}
    assert all(after[u] == first[u] for u in on_canary)
    n_canary = sum(1 for b in after.values() if b.endswith(":%d" % canary.port))
    assert 160 <= n_canary <= 240, n_canary


def test_sticky_split_by_api_key(standin, router):
    stable, canary = standin(), standin()
    r = router(pools_yaml({"stable": [stable.url], "canary": [canary.url]}) +
               "routes:\n  - model: '*'\n    split: {stable: 50, canary: 50}\n    sticky: api_key\n")
    fc = FastClient(r.base)

    def backend_of(key, how="authorization"):
        h = {"authorization": "Bearer " + key} if how == "authorization" else {"x-api-key": key}
        status, headers, _ = fc.post("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 1}, h)
        assert status == 200
        return headers["x-wafer-backend"]

    first = {k: backend_of("sk-%d" % k) for k in range(60)}
    assert 10 <= sum(1 for b in first.values() if b.endswith(":%d" % canary.port)) <= 50
    for k in range(60):  # the same key, the same pool, whichever header carries it
        assert backend_of("sk-%d" % k, "x-api-key" if k % 2 else "authorization") == first[k]
    fc.close()


def test_sighup_reload_drops_no_request(standin, router):
    old, new = standin(), standin()
    old.token_s = new.token_s = 0.1
    conf = "routes:\n  - {model: '*', pool: %s}\n"
    pools = pools_yaml({"p_old": [old.url], "p_new": [new.url]})
    r = router(pools + conf % "p_old")
    import concurrent.futures as cf

    def stream_one(i):
        body = {"model": "m", "prompt": "s%d" % i, "max_tokens": 16, "stream": True}
        with httpx.Client(base_url=r.base, timeout=20) as c:
            with c.stream("POST", "/v1/completions", json=body) as s:
                ev = sse_events(s)
        assert ev[-1] == "[DONE]"
        return stream_text(ev) == text_of(generate(list(("s%d" % i).encode()), 16))

    with cf.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(stream_one, i) for i in range(6)]
        deadline = time.time() + 10
        while old.running < 6:  # the streams are running on p_old
            assert time.time() < deadline
            time.sleep(0.01)
        r.reload(pools_yaml({"p_new": [new.url]}) + conf % "p_new")  # p_old leaves the config
        quick = [ex.submit(lambda: r.client.post("/v1/completions", json={"model": "m", "prompt": "q",
                                                                          "max_tokens": 1}).status_code)
                 for _ in range(20)]
        assert all(f.result(timeout=20) for f in futs)  # every stream finished whole
        assert [f.result(timeout=20) for f in quick] == [200] * 20
    assert old.generations() == 6
    assert new.generations() == 20
    # a broken file is refused and the running config kept
    with open(r.cfg, "w") as f:
        f.write("pools: [\n")
    r.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 10
    while "keeping the running config" not in r.log():
        assert time.time() < deadline
        time.sleep(0.02)
    assert r.client.post("/v1/completions", json={"model": "m", "prompt": "q", "max_tokens": 1}).status_code == 200
    assert new.generations() == 21


# ---- 3. retries, fallback, health, ejection, least loaded --------------------------------------------


def one_pool(urls, extra=""):
    return pools_yaml({"p": urls}) + "routes:\n  - {model: '*', pool: p}\n" + extra


@pytest.mark.parametrize("mode,kind", [("status500", "status_5xx"), ("status429", "status_429"),
                                       ("garbage", "garbage"), ("hang", "timeout"), ("cut-early", "broken"),
                                       ("badjson-early", "garbage")])
def test_retry_before_the_first_byte_on_another_backend(mode, kind, standin, router):
    bad, good = standin(), standin()
    if mode.endswith("-early"):  # a stream that breaks before its first event reaches the client
        mode = mode[:-6]
        bad.cut_after = 0
    bad.mode = mode
    bad.hang_s = 3
    r = router(one_pool([bad.url, good.url], "retries: {max: 2, base_ms: 5, cap_ms: 20}\n"
                        "timeouts: {header_ms: 400}\nhealth: {eject_after: 0}\n"))
    stream = mode in ("cut", "badjson")
    for i in range(40):  # at least 8 requests, and on until the bad one was picked twice (ties are random)
        if i >= 8 and bad.generations() >= 2:
            break
        body = {"model": "m", "prompt": "p%d" % i, "max_tokens": 4, "stream": stream}
        want = text_of(generate(list(("p%d" % i).encode()), 4))
        if stream:
            with r.client.stream("POST", "/v1/completions", json=body) as s:
                assert s.status_code == 200
                assert stream_text(sse_events(s)) == want
        else:
            resp = r.client.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["text"] == want
    n_bad = bad.generations()
    assert n_bad >= 2  # every one of its answers was retried
    m = r.metrics()
    assert m['wafer_route_backend_errors_total{backend="127.0.0.1:%d",kind="%s"}' % (bad.port, kind)] == n_bad
    assert m["wafer_route_retries_total"] == n_bad
    assert re.search(r"backends=127\.0\.0\.1:%d\(\S+\),127\.0\.0\.1:%d\(200\) retries=1" % (bad.port, good.port),
                     r.log())


def test_connect_error_is_retried(standin, router):
    gone, good = standin(), standin()
    r = router(one_pool([gone.url, good.url], "health: {interval_s: 60, eject_after: 0}\n"))
    gone.close()  # after the router saw it healthy: now its port refuses connections
    key = 'wafer_route_backend_errors_total{backend="127.0.0.1:%d",kind="connect"}' % gone.port
    for i in range(40):  # until it was picked (ties are random)
        assert r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}).status_code == 200
        if r.metrics()[key] >= 1:
            break
    assert r.metrics()[key] >= 1


def test_retry_after_is_honoured_and_the_last_error_passed_on(standin, router):
    s = standin()
    s.retry_after = 1
    s.script.extend(["status429"])
    r = router(one_pool([s.url], "retries: {max: 2, base_ms: 1, cap_ms: 10}\nhealth: {eject_after: 0}\n"))
    import concurrent.futures as cf

    def timed_post():
        t0 = time.time()
        resp = httpx.post(r.base + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}, timeout=10)
        return resp.status_code, time.time() - t0

    with cf.ThreadPoolExecutor(1) as ex:
        first = ex.submit(timed_post)
        deadline = time.time() + 5
        while s.generations() < 1:
            assert time.time() < deadline
            time.sleep(0.01)
        # the Retry-After holds back the request it was given to, not the others
        status, dt2 = timed_post()
        assert status == 200 and dt2 < 0.5, dt2
        status, dt = first.result(timeout=10)
    assert status == 200
    assert 0.9 <= dt < 3, dt  # waited for the Retry-After of the only backend, not the 1..10 ms backoff
    # every attempt refused: the client gets the backend's 429 and its Retry-After
    s.mode = "status429"
    resp = r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["code"] == "queue_full"
    assert s.generations() == 1 + 1 + 1 + 3


def test_failing_canary_falls_back_to_stable(standin, router):
    stable, canary = standin(), standin(mode="status500")
    r = router(pools_yaml({"stable": [stable.url], "canary": [canary.url]}) +
               "routes:\n  - model: '*'\n    split: {stable: 0, canary: 100}\n    fallback: [stable]\n"
               "retries: {max: 2, base_ms: 1, cap_ms: 5}\nhealth: {eject_after: 0}\n")
    for _ in range(5):
        with r.client.stream("POST", "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 3,
                                                              "stream": True}) as s:
            assert s.status_code == 200
            assert stream_text(sse_events(s)) == text_of(generate(list(b"x"), 3))
    assert stable.generations() == 5
    m = r.metrics()
    assert m["wafer_route_fallbacks_total"] == 5
    assert "fallbacks=1" in r.log()


def test_passive_ejection_with_growing_cooldown_and_half_open_probe(standin, router):
    bad, good = standin(mode="status500"), standin()
    r = router(one_pool([bad.url, good.url], "retries: {max: 1, base_ms: 1, cap_ms: 2}\n"
                        "health: {eject_after: 2, cooldown_s: 0.6, cooldown_max_s: 5, interval_s: 30}\n"))
    body = {"model": "m", "prompt": "x", "max_tokens": 1}
    deadline = time.time() + 10
    while "ejection 1)" not in r.log():
        assert r.client.post("/v1/completions", json=body).status_code == 200
        assert time.time() < deadline
    assert bad.generations() == 2
    assert "ejected for 0.6 s after 2 consecutive failure(s)" in r.log()
    # during the cooldown nothing goes to it
    for _ in range(10):
        assert r.client.post("/v1/completions", json=body).status_code == 200
    assert bad.generations() == 2
    time.sleep(0.7)
    # half open: one request probes it (ties are broken at random: a few requests until one lands there),
    # fails (and is retried on the good one): ejected again, twice as long
    for _ in range(30):
        assert r.client.post("/v1/completions", json=body).status_code == 200
        if bad.generations() == 3:
            break
    assert bad.generations() == 3
    assert "ejected for 1.2 s after 3 consecutive failure(s) (ejection 2)" in r.log()
    bad.mode = "ok"
    time.sleep(0.7)
    for _ in range(5):
        assert r.client.post("/v1/completions", json=body).status_code == 200
    assert bad.generations() == 3  # still cooling down (1.2 s)
    time.sleep(0.6)
    for _ in range(30):
        assert r.client.post("/v1/completions", json=body).status_code == 200
        if bad.generations() == 4:
            break
    assert "answered its probe: back in rotation" in r.log()
    assert bad.generations() >= 4
    assert r.metrics()['wafer_route_backend_ejections_total{backend="127.0.0.1:%d"}' % bad.port] == 2


def test_active_health_checks_take_a_backend_out_and_back(standin, router):
    a, b = standin(), standin()
    r = router(one_pool([a.url, b.url], "health: {interval_s: 0.1, timeout_ms: 500}\n"))
    a.ready = False
    deadline = time.time() + 5
    while 'wafer_route_backend_up{backend="127.0.0.1:%d"} 0' % a.port not in r.client.get("/metrics").text:
        assert time.time() < deadline
        time.sleep(0.05)
    n = a.generations()
    for _ in range(10):
        assert r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}).status_code == 200
    assert a.generations() == n
    assert "127.0.0.1:%d is down: /ready answered 503" % a.port in r.log()
    a.ready = True
    while 'wafer_route_backend_up{backend="127.0.0.1:%d"} 1' % a.port not in r.client.get("/metrics").text:
        assert time.time() < deadline
        time.sleep(0.05)


def test_least_loaded_backend_by_reported_load(standin, router):
    busy, idle = standin(), standin()
    busy.extra_load = 12  # what its /metrics says: wafer_requests_running 12
    r = router(one_pool([busy.url, idle.url], "health: {interval_s: 0.1}\n"))
    deadline = time.time() + 5
    while 'wafer_route_backend_load{backend="127.0.0.1:%d"} 12' % busy.port not in r.client.get("/metrics").text:
        assert time.time() < deadline
        time.sleep(0.05)
    fc = FastClient(r.base)
    for _ in range(20):
        assert fc.post("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 1})[0] == 200
    assert busy.generations() == 0 and idle.generations() == 20
    # the router's own requests count too: with slow answers in flight on `idle`, new ones spread out
    busy.extra_load = 0
    idle.token_s = busy.token_s = 0.5  # 1 s per request: all 6 are in flight before the first ends
    time.sleep(0.3)
    import concurrent.futures as cf
    with cf.ThreadPoolExecutor(6) as ex:
        res = list(ex.map(lambda i: httpx.post(r.base + "/v1/completions", timeout=10,
                                               json={"model": "m", "prompt": "x", "max_tokens": 2}).status_code,
                          range(6)))
    assert res == [200] * 6
    assert busy.generations() == 3 and idle.generations() == 23
    fc.close()


# ---- 4. cancellation -------------------------------------------------------------------------------------


def test_client_gone_closes_the_upstream_request(make_server, router, slow_model):
    s = make_server(slow_model)  # 16 choices x 2000 tokens of the slow model: some 10 s for one thread
    r = router(one_pool([s.base]))
    body = {"model": "slow-llama", "prompt": "Once upon a time", "max_tokens": 2000, "n": 16,
            "ignore_eos": True, "temperature": 0}
    cancelled = s.metrics().get("wafer_requests_cancelled_total", 0)
    # a stream the client leaves after its first bytes
    with httpx.Client(timeout=20) as c:
        with c.stream("POST", r.base + "/v1/completions", json={**body, "stream": True}) as resp:
            assert resp.status_code == 200
            chunks = resp.iter_raw()  # kept: a dropped generator closes the response
            next(chunks)
            s.wait_metric("wafer_requests_running", lambda v: v == 1, timeout=3)
    t0 = time.time()
    s.wait_metric("wafer_requests_running", lambda v: v == 0, timeout=3)
    assert time.time() - t0 < 1.5  # not the seconds the answer would have taken
    s.wait_metric("wafer_requests_cancelled_total", lambda v: v == cancelled + 1, timeout=3)
    # a client that gives up waiting for a non-streamed answer
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(r.base + "/v1/completions", json=body, timeout=httpx.Timeout(20, read=0.5))
    t0 = time.time()
    s.wait_metric("wafer_requests_cancelled_total", lambda v: v == cancelled + 2, timeout=3)
    s.wait_metric("wafer_requests_running", lambda v: v == 0, timeout=3)
    assert time.time() - t0 < 1.5
    deadline = time.time() + 3
    while r.metrics()["wafer_route_requests_in_flight"] != 0:
        assert time.time() < deadline
        time.sleep(0.02)


# ---- 5. stream resume ------------------------------------------------------------------------------------


def stream_events(r, path, body, headers=None):
    with r.client.stream("POST", path, json=body, headers=headers or {}) as s:
        assert s.status_code == 200
        return sse_events(s), s.headers


@pytest.mark.parametrize("chat", [False, True])
def test_stream_resumes_on_another_backend_with_the_tokens_sent(chat, standin, router):
    first, second = standin(), standin()
    first.mode = "cut"
    first.cut_after = 6 if chat else 5  # chat: the role chunk, then 5 tokens
    r = router(pools_yaml({"a": [first.url], "b": [second.url]}) +
               "routes:\n  - {model: '*', pool: a, fallback: [b]}\nhealth: {eject_after: 0}\n")
    if chat:
        body = {"model": "m", "messages": [{"role": "user", "content": "tell"}], "max_tokens": 16, "stream": True,
                "seed": 7, "temperature": 0.5, "stream_options": {"include_usage": True}}
        prompt = list(b"tell")
    else:
        body = {"model": "m", "prompt": "tell", "max_tokens": 16, "stream": True, "seed": 7, "temperature": 0.5,
                "stream_options": {"include_usage": True}}
        prompt = list(b"tell")
    ev, _ = stream_events(r, "/v1/chat/completions" if chat else "/v1/completions", body)
    want = generate(prompt, 16)
    assert ev[-1] == "[DONE]"
    assert stream_text(ev, chat=chat) == text_of(want)  # one uninterrupted answer
    objs = [json.loads(e) for e in ev[:-1]]
    assert len({o["id"] for o in objs}) == 1  # under one id
    assert all("token_ids" not in json.dumps(o) for o in objs)
    assert objs[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 16, "total_tokens": 20}
    assert [c["finish_reason"] for o in objs for c in o["choices"] if c["finish_reason"]] == ["length"]
    if chat:
        assert objs[0]["choices"][0]["delta"]["role"] == "assistant"
        assert all(o["object"] == "chat.completion.chunk" for o in objs)
    # the continuation: a token-id prompt of the prompt and the 5 tokens sent, the remaining budget, same seed
    cont = second.records[-1]
    assert cont["path"] == "/v1/completions"
    assert cont["body"]["prompt"] == prompt + want[:5]
    assert cont["body"]["max_tokens"] == 11
    assert cont["body"]["seed"] == 7 and cont["body"]["temperature"] == 0.5
    assert "messages" not in cont["body"]
    m = r.metrics()
    assert m['wafer_route_resumes_total{result="ok"}'] == 1
    assert "resuming on another backend" in r.log()


def test_stream_that_cannot_resume_ends_with_an_error_event(standin, router):
    s = standin(mode="cut")
    s.cut_after = 3
    r = router(pools_yaml({"p": [s.url]}, kind="openai") + "routes:\n  - {model: '*', pool: p}\n"
               "health: {eject_after: 0}\n")
    ev, _ = stream_events(r, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 10, "stream": True})
    assert ev[-1] == "[DONE]"
    err = json.loads(ev[-2])["error"]
    assert err["code"] == "stream_interrupted" and err["type"] == "server_error"
    assert "after 3 token(s)" in err["message"]
    assert stream_text(ev[:-2]) == text_of(generate(list(b"x"), 3))
    assert r.metrics()["wafer_route_stream_errors_total"] == 1


def test_wafer_serve_streams_token_ids_on_request(stories_server):
    """What the resume relies on: wafer serve's return_token_ids (vLLM's name)."""
    s = stories_server
    body = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0,
            "stream": True, "return_token_ids": True}
    with s.client.stream("POST", "/v1/completions", json=body) as resp:
        ev = sse_events(resp)
    objs = [json.loads(e) for e in ev if e != "[DONE]"]
    ids = [t for o in objs for t in o["choices"][0]["token_ids"]]
    assert len(ids) == 12
    assert objs[0]["choices"][0]["prompt_token_ids"] == s.client.post(
        "/tokenize", json={"content": "Once upon a time"}).json()["tokens"]
    assert all("prompt_token_ids" not in o["choices"][0] for o in objs[1:])
    text = "".join(o["choices"][0]["text"] for o in objs)
    assert text == s.client.post("/detokenize", json={"tokens": ids}).json()["content"]
    # chat: the role chunk carries the prompt's ids
    chat = {"model": "stories260K", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": True, "return_token_ids": True}
    with s.client.stream("POST", "/v1/chat/completions", json=chat) as resp:
        ev = sse_events(resp)
    first = json.loads(ev[0])["choices"][0]
    assert first["delta"]["role"] == "assistant" and len(first["prompt_token_ids"]) > 2
    assert sum(len(json.loads(e)["choices"][0]["token_ids"]) for e in ev[:-1]) == 4
    # not asked: no ids
    with s.client.stream("POST", "/v1/completions", json={**body, "return_token_ids": False}) as resp:
        assert "token_ids" not in resp.read().decode()


def test_kill_9_mid_stream_resumes_with_the_same_greedy_text(make_server, router, slow_model):
    # the slow model: the kill after the 5th event lands with half a second of the stream still to come
    a = make_server(slow_model)
    b = make_server(slow_model)
    r = router(one_pool([a.base, b.base], "health: {interval_s: 0.5}\n"))
    body = {"model": "slow-llama", "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0,
            "ignore_eos": True}
    unbroken = a.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert unbroken == b.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    servers = {a.base.split("//")[1]: a, b.base.split("//")[1]: b}
    text, killed = "", None
    with r.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
        assert s.status_code == 200
        victim = servers[s.headers["x-wafer-backend"]]
        buf, n = "", 0
        for chunk in s.iter_text():
            buf += chunk
            while "\n\n" in buf:
                block, buf = buf.split("\n\n", 1)
                payload = block[6:]
                if payload == "[DONE]":
                    continue
                o = json.loads(payload)
                assert "error" not in o, o
                text += o["choices"][0]["text"]
                n += 1
                if n == 5 and killed is None:
                    victim.proc.send_signal(signal.SIGKILL)
                    killed = victim
    assert killed is not None
    assert text == unbroken
    assert r.metrics()['wafer_route_resumes_total{result="ok"}'] == 1, r.log()[-2000:]


@pytest.mark.parametrize("chat", [False, True])
def test_kill_9_mid_stream_resumes_every_choice_with_its_logprobs(chat, make_server, router, slow_model):
    """n = 2 with logprobs: each choice is continued with its own tokens and budget, and the client gets
    the text, token logprobs, top alternatives and (completions) text offsets of an unbroken run. The slow
    model: 120 steps take a third of a second (on llama-19M 30-40 ms, about as long as the client's reads
    before the kill)."""
    a = make_server(slow_model, "--chat-template", "chatml")
    b = make_server(slow_model, "--chat-template", "chatml")
    r = router(one_pool([a.base, b.base], "health: {interval_s: 0.5}\n"))
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"model": "slow-llama", "max_tokens": 120, "temperature": 0, "ignore_eos": True, "n": 2,
            "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body.update(messages=[{"role": "user", "content": "Once upon a time"}], logprobs=True, top_logprobs=2)
    else:
        # this prompt's greedy run holds back a token's bytes (token 28 with stop 21's block-sum numerics;
        # "Once upon a time" had one before them, and none now)
        body.update(prompt="Once upon a time €", logprobs=2)

    def collect(events):
        """Per choice: text, [(token, logprob, top tokens, offset)], finish reasons; and the usage."""
        text, toks, fins, usage = {}, {}, {}, None
        for e in events:
            if e == "[DONE]":
                continue
            o = json.loads(e)
            assert "error" not in o, o
            if o.get("usage"):
                usage = o["usage"]
            for c in o["choices"]:
                i = c["index"]
                text[i] = text.get(i, "") + ((c["delta"].get("content") or "") if chat else c["text"])
                if c["finish_reason"]:
                    fins.setdefault(i, []).append(c["finish_reason"])
                lp = c["logprobs"]
                if not lp:
                    continue
                if chat:
                    for t in lp["content"]:
                        toks.setdefault(i, []).append((t["token"], t["logprob"], tuple(x["token"] for x in t["top_logprobs"]),
                                                       tuple(t["bytes"])))
                else:
                    for k, t in enumerate(lp["tokens"]):
                        toks.setdefault(i, []).append((t, lp["token_logprobs"][k], tuple(lp["top_logprobs"][k]),
                                                       lp["text_offset"][k]))
        return text, toks, fins, usage

    with a.client.stream("POST", path, json=body) as s:
        want_text, want_toks, want_fins, want_usage = collect(sse_events(s))
    assert len(want_toks[0]) == len(want_toks[1]) == 120
    if not chat:
        # the unbroken run has a token whose bytes are held back (its chunk: logprobs, no text; the next token
        # has the same offset) well after the kill: the continuation must relay such a chunk too (the router
        # once dropped it, and the client got 119 tokens)
        held = [k for k in range(119) if want_toks[0][k][3] == want_toks[0][k + 1][3]]
        assert held and held[0] > 10, held
    servers = {a.base.split("//")[1]: a, b.base.split("//")[1]: b}
    events, killed = [], None
    with r.client.stream("POST", path, json=body) as s:
        assert s.status_code == 200
        victim = servers[s.headers["x-wafer-backend"]]
        buf = ""
        for chunk in s.iter_text():
            buf += chunk
            while "\n\n" in buf:
                block, buf = buf.split("\n\n", 1)
                events.append(block[6:])
                if len(events) == 9 and killed is None:  # both choices under way, neither finished
                    victim.proc.send_signal(signal.SIGKILL)
                    killed = victim
    assert killed is not None
    assert events[-1] == "[DONE]"
    text, toks, fins, usage = collect(events)
    assert text == want_text
    assert fins == want_fins == {0: ["length"], 1: ["length"]}
    for i in (0, 1):
        assert len(toks[i]) == len(want_toks[i])
        for got, want in zip(toks[i], want_toks[i]):
            assert got[0] == want[0] and got[2] == want[2] and got[3] == want[3], (i, got, want)
            assert abs(got[1] - want[1]) < 1e-3, (i, got, want)
    main = ("prompt_tokens", "completion_tokens", "total_tokens")  # the router counts these itself
    assert {k: usage[k] for k in main} == {k: want_usage[k] for k in main}
    assert len({json.loads(e)["id"] for e in events[:-1]}) == 1
    m = r.metrics()
    assert m['wafer_route_resumes_total{result="ok"}'] == 1, r.log()[-2000:]
    assert "choice 0 of 2" in r.log() or "choice 1 of 2" in r.log()


def test_constrained_stream_is_not_resumed(standin, router):
    """A grammar or response format would start again in a continuation: such a stream ends with an error
    event instead of an answer that breaks its constraint."""
    first, second = standin(), standin()
    first.mode = "cut"
    first.cut_after = 3
    r = router(pools_yaml({"a": [first.url], "b": [second.url]}) +
               "routes:\n  - {model: '*', pool: a, fallback: [b]}\nhealth: {eject_after: 0}\n")
    ev, _ = stream_events(r, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 10, "stream": True,
                                                  "response_format": {"type": "json_object"}})
    assert json.loads(ev[-2])["error"]["code"] == "stream_interrupted"
    assert not any(rec["path"] == "/v1/completions" for rec in second.records)


# ---- 6. result cache, per-key limits, metrics --------------------------------------------------------------


def test_exact_result_cache(standin, router):
    s = standin()
    r = router(one_pool([s.url], "cache: {max_bytes: 64MiB, ttl_s: 1}\n"))
    body = {"model": "m", "prompt": "cache me", "max_tokens": 6, "temperature": 0}
    want = text_of(generate(list(b"cache me"), 6))
    first = r.client.post("/v1/completions", json=body)
    assert first.headers["x-wafer-cache"] == "miss"
    second = r.client.post("/v1/completions", json=body)
    assert second.headers["x-wafer-cache"] == "hit"
    assert second.json() == first.json()
    assert s.generations() == 1
    # the same request streamed: served from the cache as a stream
    ev, headers = stream_events(r, "/v1/completions", {**body, "stream": True})
    assert headers["x-wafer-cache"] == "hit" and stream_text(ev) == want and ev[-1] == "[DONE]"
    assert s.generations() == 1
    # key order and the stream flag do not matter; other parameters do
    same = r.client.post("/v1/completions", content=json.dumps(dict(reversed(list(body.items())))).encode())
    assert same.headers["x-wafer-cache"] == "hit"
    other = r.client.post("/v1/completions", json={**body, "max_tokens": 5})
    assert other.headers["x-wafer-cache"] == "miss"
    # a bypass goes to the backend; a sampled request (no seed) is never cached
    assert r.client.post("/v1/completions", json=body, headers={"x-wafer-cache": "bypass"}).headers[
        "x-wafer-cache"] == "bypass"
    sampled = r.client.post("/v1/completions", json={**body, "temperature": 0.7})
    assert "x-wafer-cache" not in sampled.headers
    seeded = {**body, "temperature": 0.7, "seed": 3}
    r.client.post("/v1/completions", json=seeded)
    assert r.client.post("/v1/completions", json=seeded).headers["x-wafer-cache"] == "hit"
    n = s.generations()
    # a streamed miss is stored too, and a chat answer comes back as a chat completion
    chat = {"model": "m", "messages": [{"role": "user", "content": "hey"}], "max_tokens": 3, "temperature": 0}
    ev, headers = stream_events(r, "/v1/chat/completions", {**chat, "stream": True})
    assert headers["x-wafer-cache"] == "miss"
    hit = r.client.post("/v1/chat/completions", json=chat)
    assert hit.headers["x-wafer-cache"] == "hit"
    assert hit.json()["object"] == "chat.completion"
    assert hit.json()["choices"][0]["message"]["content"] == stream_text(ev, chat=True)
    assert s.generations() == n + 1
    # TTL
    time.sleep(1.1)
    assert r.client.post("/v1/completions", json=body).headers["x-wafer-cache"] == "miss"
    m = r.metrics()
    assert m['wafer_route_cache_total{result="hit"}'] == 5
    assert m["wafer_route_cache_bytes"] > 0


def test_cache_byte_bound_evicts_the_least_recent(standin, router):
    s = standin()
    r = router(one_pool([s.url], "cache: {max_bytes: 2KiB, ttl_s: 600}\n"))
    bodies = [{"model": "m", "prompt": "p%d" % i, "max_tokens": 8, "temperature": 0} for i in range(12)]
    for b in bodies:
        assert r.client.post("/v1/completions", json=b).headers["x-wafer-cache"] == "miss"
    m = r.metrics()
    assert m["wafer_route_cache_bytes"] <= 2048
    assert m["wafer_route_cache_evictions_total"] >= 4
    assert r.client.post("/v1/completions", json=bodies[-1]).headers["x-wafer-cache"] == "hit"
    assert r.client.post("/v1/completions", json=bodies[0]).headers["x-wafer-cache"] == "miss"


def test_per_key_limits(standin, router):
    s = standin()
    r = router(one_pool([s.url], "limits:\n  keys:\n"
                        "    - {key: sk-rpm, rpm: 3}\n"
                        "    - {key: sk-conc, concurrent: 1}\n"
                        "    - {key: sk-tpm, tpm: 100}\n"
                        "    - {key: sk-free}\n"))
    body = {"model": "m", "prompt": "abcd", "max_tokens": 2}

    def post(key, b=body):
        h = {"authorization": "Bearer " + key} if key else {}
        return r.client.post("/v1/completions", json=b, headers=h)

    for key in (None, "sk-nope", "sk-rp", "sk-rpmx"):
        resp = post(key)
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "invalid_api_key"
    # rpm 3
    rem = []
    for _ in range(3):
        resp = post("sk-rpm")
        assert resp.status_code == 200
        assert resp.headers["x-ratelimit-limit-requests"] == "3"
        rem.append(resp.headers["x-ratelimit-remaining-requests"])
    assert rem == ["2", "1", "0"]
    resp = post("sk-rpm")
    assert resp.status_code == 429
    assert resp.json()["error"]["type"] == "rate_limit_exceeded" and "requests per minute" in resp.json()["error"]["message"]
    assert 15 <= int(resp.headers["retry-after"]) <= 21  # one request back after 20 s
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    assert re.fullmatch(r"\d+(\.\d+)?s|\d+m\d+s", resp.headers["x-ratelimit-reset-requests"])
    assert "authorization" not in s.records[-1]["headers"]  # the router's keys stay with the router
    # concurrent 1: a second request while one streams
    s.token_s = 0.1
    with r.client.stream("POST", "/v1/completions", json={**body, "max_tokens": 8, "stream": True},
                         headers={"authorization": "Bearer sk-conc"}) as held:
        assert held.status_code == 200
        resp = post("sk-conc")
        assert resp.status_code == 429 and "concurrent" in resp.json()["error"]["message"]
        held.read()
    s.token_s = 0
    assert post("sk-conc").status_code == 200
    # tpm 100: prompt estimate + max_tokens reserved, settled with the real usage
    assert post("sk-tpm", {**body, "max_tokens": 80}).status_code == 200
    resp = post("sk-tpm", {**body, "max_tokens": 80})
    assert resp.status_code == 429 and "tokens per minute" in resp.json()["error"]["message"]
    assert int(resp.headers["x-ratelimit-remaining-tokens"]) == 100 - (4 + 80)
    assert post("sk-tpm", {**body, "max_tokens": 5}).status_code == 200
    for _ in range(10):
        assert post("sk-free").status_code == 200
    m = r.metrics()
    assert m['wafer_route_limited_total{kind="auth"}'] == 4
    assert m['wafer_route_limited_total{kind="rpm"}'] == 1
    assert m['wafer_route_limited_total{kind="concurrent"}'] == 1
    assert m['wafer_route_limited_total{kind="tpm"}'] == 1
    assert m['wafer_route_requests_total{status="4xx"}'] == 7


def test_metrics_and_log_line(standin, router):
    bad, good = standin(mode="status500"), standin()
    r = router(one_pool([bad.url, good.url], "health: {eject_after: 0}\nretries: {base_ms: 1, cap_ms: 2}\n"))
    for i in range(10):
        assert r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}).status_code == 200
    while bad.generations() == 0:  # until the bad one was picked once (ties are random)
        assert r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}).status_code == 200
        i += 1
        assert i < 40
    n = i + 1
    text = r.client.get("/metrics").text
    for name in ("wafer_route_requests_total", "wafer_route_retries_total", "wafer_route_fallbacks_total",
                 "wafer_route_resumes_total", "wafer_route_backend_errors_total", "wafer_route_backend_ejections_total",
                 "wafer_route_backend_requests_total", "wafer_route_request_duration_seconds_bucket",
                 "wafer_route_backend_response_seconds_bucket", "wafer_route_cache_total", "wafer_route_limited_total",
                 "wafer_route_backend_up", "wafer_route_time_to_first_byte_seconds_count"):
        assert "\n" + name in text, name
    m = r.metrics()
    assert m['wafer_route_requests_total{status="2xx"}'] == n
    assert m['wafer_route_backend_requests_total{backend="127.0.0.1:%d"}' % good.port] == n
    assert m["wafer_route_request_duration_seconds_count"] == n
    lines = [l for l in r.log().splitlines() if "route: POST /v1/completions" in l]
    assert len(lines) == n
    assert all(re.search(r"status=200 backends=\S+ retries=\d fallbacks=0 resumes=0 cache=- [\d.]+ ms$", l)
               for l in lines), lines
    assert any("127.0.0.1:%d(500),127.0.0.1:%d(200)" % (bad.port, good.port) in l for l in lines)


def test_backend_by_host_name_has_every_address_as_a_member(standin, router):
    s = standin()
    r = router(one_pool(["http://localhost:%d" % s.port]))
    text = r.client.get("/metrics").text
    labels = set(re.findall(r'wafer_route_backend_up\{backend="(localhost:%d/[^"]+)"\}' % s.port, text))
    assert "localhost:%d/127.0.0.1:%d" % (s.port, s.port) in labels
    for _ in range(5):
        assert r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}).status_code == 200
    assert s.records[-1]["headers"]["host"] == "localhost:%d" % s.port


def test_a_busy_backend_is_not_ejected(standin, router):
    busy, good = standin(mode="status429"), standin()
    r = router(one_pool([busy.url, good.url], "retries: {base_ms: 1, cap_ms: 2}\nhealth: {eject_after: 2}\n"))
    for _ in range(60):  # until the busy one was picked (ties are random) more often than eject_after
        assert r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}).status_code == 200
        if busy.generations() >= 4:
            break
    m = r.metrics()
    assert m['wafer_route_backend_errors_total{backend="127.0.0.1:%d",kind="status_429"}' % busy.port] >= 4
    assert m['wafer_route_backend_ejections_total{backend="127.0.0.1:%d"}' % busy.port] == 0


def test_limits_follow_their_key_across_a_reload(standin, router):
    s = standin()
    keys = "limits:\n  keys:\n    - {key: sk-%s, concurrent: 1}\n    - {key: sk-%s, concurrent: 1}\n"
    base = one_pool([s.url])
    r = router(base + keys % ("a", "b"))
    s.token_s = 0.1
    with r.client.stream("POST", "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 6, "stream": True},
                         headers={"authorization": "Bearer sk-b"}) as held:
        assert held.status_code == 200
        r.reload(base + keys % ("b", "a"))  # sk-b is now the first key, and still has one request in flight
        assert r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1},
                             headers={"authorization": "Bearer sk-b"}).status_code == 429
        held.read()
    s.token_s = 0
    for key in ("sk-a", "sk-b"):
        assert r.client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1},
                             headers={"authorization": "Bearer " + key}).status_code == 200


def test_sse_comments_pass_through_whole(standin, router):
    s = standin()
    s.comments = True
    r = router(one_pool([s.url]))
    with r.client.stream("POST", "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 4,
                                                          "stream": True}) as resp:
        raw = resp.read().decode()
    assert raw.count(": keep-alive\n\n") == 3  # the one before the first event: the stream had not begun
    blocks = [b for b in raw.split("\n\n") if b]
    assert all(b.startswith("data: ") or b == ": keep-alive" for b in blocks), blocks
    assert stream_text([b[6:] for b in blocks if b.startswith("data: ")]) == text_of(generate(list(b"x"), 4))
