"""wafer serve in models mode (docs/models.md): many models behind one address, one child `wafer serve` per
loaded model. Routing by name and alias, /v1/models states, load on first request, keep_alive, LRU eviction
under memory_budget, the admin API and its keys, a slow load (a real slow download from the hub stand-in)
not stalling another model, kill -9 of a child mid-request, greedy output equal to a direct wafer serve,
unknown models, bad configs. Models: the shared stories260K and llama-19M files."""
import json
import os
import signal
import socket
import subprocess
import threading
import time

import httpx
import pytest

from conftest import LLAMA19M, STORIES, WAFER_BIN, need
from hub_standin import Hub
from models_server import ModelsServer, pid_alive


@pytest.fixture
def models(tmp_path):
    made = []

    def make(yaml_text, *args, **kw):
        s = ModelsServer(tmp_path, yaml_text, *args, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def two_models(extra="", keep_alive=None, llama=LLAMA19M):
    """Config of storyteller (stories260K) and llama (llama-19M, or the file given: tests that kill or leave a
    request while it runs pass conftest's slow model)."""
    need(STORIES)
    need(LLAMA19M)
    ka = "" if keep_alive is None else f", keep_alive: {keep_alive}"
    return (f"models:\n"
            f"  - {{name: storyteller, path: {STORIES}, aliases: [tiny], max_batch_size: 4, kv_memory: 16MiB,\n"
            f"     args: [--chat-template, chatml]{ka}}}\n"
            f"  - {{name: llama, path: {llama}, kv_memory: 32MiB}}\n" + extra)


def sse_events(resp):
    out, buf = [], ""
    for text in resp.iter_text():
        buf += text
        while "\n\n" in buf:
            block, buf = buf.split("\n\n", 1)
            for line in block.split("\n"):
                if line.startswith("data: "):
                    out.append(line[6:])
    return out


def is_openai_error(body, code=None):
    e = body.get("error")
    ok = isinstance(e, dict) and isinstance(e.get("message"), str) and "type" in e and "code" in e
    return ok and (code is None or e["code"] == code)


# ---- routing, states, load on first request ---------------------------------------------------------


def test_routes_by_name_and_alias_and_lists_states(models):
    s = models(two_models())
    assert s.states() == {"storyteller": "unloaded", "llama": "unloaded"}
    r = s.complete("tiny")  # the alias loads the model on this first request
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "storyteller" and r.json()["choices"][0]["text"]
    assert s.states() == {"storyteller": "loaded", "llama": "unloaded"}
    r = s.complete("storyteller")
    assert r.status_code == 200
    one = s.client.get("/v1/models/tiny").json()
    assert one["id"] == "storyteller" and one["state"] == "loaded" and one["aliases"] == ["tiny"]
    chat = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    # llama-19M has no chat template: its server's own 400 passes through as it is
    r = s.client.post("/v1/chat/completions", json=dict(chat, model="llama"))
    assert r.status_code == 400 and is_openai_error(r.json(), "chat_template_unavailable"), r.text
    # the storyteller's args gave its server one
    r = s.client.post("/v1/chat/completions", json=dict(chat, model="tiny"))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant", r.text
    r = s.complete("llama")
    assert r.status_code == 200 and r.json()["model"] == "llama"
    assert s.states() == {"storyteller": "loaded", "llama": "loaded"}
    m = s.metrics()
    assert m['wafer_models_loaded{model="storyteller"}'] == 1 and m['wafer_models_loads_total{model="llama"}'] == 1
    assert "loading 'storyteller'" in s.log() and "reason: request" in s.log()
    # each child's log lines come back with its model's name in front
    assert "[storyteller] " in s.log() and "[llama] " in s.log()
    assert any(l.startswith("[llama] ") and "ready: http://127.0.0.1:" in l for l in s.log().splitlines())
    assert 'wafer_route_backend_requests_total{backend="storyteller"}' in s.client.get("/metrics").text
    # two models, two children with their own ports
    a = s.admin_models()
    assert a["storyteller"]["pid"] != a["llama"]["pid"] and a["storyteller"]["port"] != a["llama"]["port"]


def test_unknown_model_is_404_listing_the_names(models):
    s = models(two_models())
    r = s.complete("gpt-4")
    assert r.status_code == 404 and is_openai_error(r.json(), "model_not_found"), r.text
    msg = r.json()["error"]["message"]
    assert "gpt-4" in msg and "storyteller" in msg and "tiny" in msg and "llama" in msg
    r = s.client.post("/v1/completions", json={"prompt": "x"})
    assert r.status_code == 404 and is_openai_error(r.json(), "model_not_found")
    assert s.client.get("/v1/models/gpt-4").status_code == 404
    assert s.states() == {"storyteller": "unloaded", "llama": "unloaded"}  # nothing loaded for it


def test_greedy_output_equals_a_direct_wafer_serve(models, make_server):
    direct = make_server(STORIES, "--max-batch-size", "4", "--kv-memory", "16MiB")
    s = models(two_models())
    for prompt in ("Once upon a time", "The little dog"):
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
        want = direct.client.post("/v1/completions", json=dict(body, model="stories260K")).json()
        got = s.client.post("/v1/completions", json=dict(body, model="storyteller")).json()
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
        # streamed through the manager: the same text, relayed event by event
        with s.client.stream("POST", "/v1/completions", json=dict(body, model="tiny", stream=True)) as resp:
            assert resp.status_code == 200
            ev = sse_events(resp)
        assert ev[-1] == "[DONE]"
        assert "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1]) == want["choices"][0]["text"]


# ---- keep_alive, eviction --------------------------------------------------------------------------


def test_keep_alive_unloads_an_idle_model_and_the_next_request_reloads_it(models):
    s = models(two_models(keep_alive=1))
    assert s.complete("storyteller").status_code == 200
    assert s.complete("llama").status_code == 200
    pid = s.admin_models()["storyteller"]["pid"]
    s.wait_state("storyteller", "unloaded", timeout=10)
    assert not pid_alive(pid)
    assert "unloading 'storyteller'" in s.log() and "reason: keep_alive" in s.log()
    assert s.admin_models()["llama"]["state"] == "loaded"  # the default keep_alive (300 s) keeps it
    m = s.metrics()
    assert m['wafer_models_unloads_total{model="storyteller",reason="keep_alive"}'] == 1
    r = s.complete("tiny")
    assert r.status_code == 200
    assert s.metrics()['wafer_models_loads_total{model="storyteller"}'] == 2


def test_lru_eviction_under_the_memory_budget(models):
    need(STORIES)
    # each model: the 1.1 MiB file + 16 MiB of KV budget; 40 MiB holds two of them
    entries = "".join(f"  - {{name: {n}, path: {STORIES}, kv_memory: 16MiB}}\n" for n in ("a", "b", "c"))
    big = f"  - {{name: big, path: {STORIES}, kv_memory: 64MiB}}\n"
    s = models("memory_budget: 40MiB\nmodels:\n" + entries + big)
    for name in ("a", "b", "a"):  # a is the most recently used of the two
        assert s.complete(name).status_code == 200
    assert s.states() == {"a": "loaded", "b": "loaded", "c": "unloaded", "big": "unloaded"}
    assert s.complete("c").status_code == 200
    st = s.states()
    assert st["a"] == "loaded" and st["c"] == "loaded" and st["b"] in ("unloaded", "unloading"), st
    assert "evicting 'b'" in s.log() and "reason: evicted" in s.log()
    adm = s.client.get("/admin/models").json()
    assert adm["memory_used"] <= adm["memory_budget"] == 40 << 20
    # larger than the whole budget: refused at once, nothing evicted for it
    r = s.complete("big")
    assert r.status_code == 507 and is_openai_error(r.json(), "model_too_large"), r.text
    assert "memory_budget" in r.json()["error"]["message"]
    st = s.states()
    assert st["a"] == "loaded" and st["c"] == "loaded"


def test_preload_loads_at_start_as_memory_allows(models):
    need(STORIES)
    entries = "".join(f"  - {{name: {n}, path: {STORIES}, kv_memory: 16MiB, preload: true}}\n" for n in ("a", "b", "c"))
    s = models("memory_budget: 40MiB\nmodels:\n" + entries + f"  - {{name: d, path: {STORIES}, kv_memory: 16MiB}}\n")
    s.wait_state("a", "loaded")
    s.wait_state("b", "loaded")
    st = s.states()
    assert st["c"] == "unloaded" and st["d"] == "unloaded", st  # c did not fit next to a and b
    assert "reason: preload" in s.log() and "'c' is not preloaded" in s.log()
    assert s.metrics()['wafer_models_loads_total{model="a"}'] == 1


def test_max_loaded_keeps_one_model(models):
    need(STORIES)
    entries = "".join(f"  - {{name: {n}, path: {STORIES}, kv_memory: 16MiB}}\n" for n in ("a", "b"))
    s = models("max_loaded: 1\nmodels:\n" + entries)
    assert s.complete("a").status_code == 200
    assert s.complete("b").status_code == 200
    st = s.states()
    assert st["b"] == "loaded" and st["a"] in ("unloaded", "unloading")


# ---- the admin API ---------------------------------------------------------------------------------


def test_admin_api_behind_the_admin_key(models):
    s = models(two_models("auth: {admin_keys: [sk-admin]}\n"), admin_key="sk-admin")
    for hdr in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer sk-admin2"}):
        r = s.client.get("/admin/models", headers=hdr)
        assert r.status_code == 401 and is_openai_error(r.json(), "invalid_api_key"), r.text
        r = s.client.post("/admin/models/load", json={"model": "tiny"}, headers=hdr)
        assert r.status_code == 401
    assert s.states()["storyteller"] == "unloaded"  # refused calls did nothing
    h = s.headers()
    r = s.client.post("/admin/models/load", json={"model": "tiny"}, headers=h)
    assert r.status_code in (200, 202) and r.json()["name"] == "storyteller", r.text
    s.wait_state("storyteller", "loaded")
    a = s.admin_models()["storyteller"]
    assert set(a) >= {"name", "state", "path", "bytes", "last_used"} and a["path"] == STORIES
    assert a["bytes"] == os.path.getsize(STORIES) + (16 << 20)
    assert "reason: admin" in s.log()
    r = s.client.post("/admin/models/unload", json={"model": "storyteller"}, headers=h)
    assert r.status_code == 200
    s.wait_state("storyteller", "unloaded")
    assert s.metrics()['wafer_models_unloads_total{model="storyteller",reason="admin"}'] == 1
    # bad bodies and names
    r = s.client.post("/admin/models/load", content=b"{", headers=h)
    assert r.status_code == 400 and is_openai_error(r.json(), "invalid_body")
    r = s.client.post("/admin/models/load", json={"model": "nope"}, headers=h)
    assert r.status_code == 404 and "storyteller" in r.json()["error"]["message"]
    r = s.client.get("/admin/models/load", headers=h)
    assert r.status_code == 405
    # the /v1 API needs no admin key
    assert s.complete("tiny").status_code == 200


def local_ip():
    """An address of this machine other than loopback, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.connect(("10.255.255.255", 1))
            ip = u.getsockname()[0]
        return None if ip.startswith("127.") else ip
    except OSError:
        return None


def test_admin_api_without_keys_is_loopback_only(models):
    s = models(two_models("server: {host: 0.0.0.0}\n"))
    assert s.client.get("/admin/models").status_code == 200  # loopback
    ip = local_ip()
    if not ip:
        pytest.skip("no non-loopback address on this machine to call from")
    port = s.base.rsplit(":", 1)[1]
    r = httpx.get(f"http://{ip}:{port}/admin/models", timeout=10)
    assert r.status_code == 403 and is_openai_error(r.json(), "admin_loopback_only"), r.text
    assert httpx.get(f"http://{ip}:{port}/v1/models", timeout=10).status_code == 200


def test_load_on_request_off_needs_the_admin_api(models):
    s = models(two_models("load_on_request: false\n"))
    r = s.complete("tiny")
    assert r.status_code == 503 and is_openai_error(r.json(), "model_not_loaded"), r.text
    assert "/admin/models/load" in r.json()["error"]["message"]
    assert s.client.post("/admin/models/load", json={"model": "storyteller"}).status_code in (200, 202)
    s.wait_state("storyteller", "loaded")
    assert s.complete("tiny").status_code == 200


# ---- isolation: a slow load, a crashed child -------------------------------------------------------


def test_a_slow_load_does_not_stall_another_model(models, tmp_path):
    with open(need(STORIES), "rb") as f:
        stories = f.read()
    hub = Hub()
    try:
        repo = hub.add("wafer-test/stories-GGUF", {"stories260K-Q8_0.gguf": stories})
        repo.faults.add("slow")
        repo.slow_s = 4.0  # the child pulls the model over about 4 s before it can load it
        env = {"HF_ENDPOINT": hub.url, "WAFER_MODELS": str(tmp_path / "models")}
        env.pop("HF_TOKEN", None)
        s = models(f"models:\n  - {{name: fast, path: {STORIES}, kv_memory: 16MiB}}\n"
                   f"  - {{name: slow, path: 'hf://wafer-test/stories-GGUF:Q8_0', kv_memory: 16MiB}}\n", env=env)
        assert s.complete("fast").status_code == 200
        slow_result = {}

        def call_slow():
            t0 = time.monotonic()
            slow_result["r"] = s.complete("slow")
            slow_result["t"] = time.monotonic() - t0

        th = threading.Thread(target=call_slow)
        th.start()
        lat, seen_loading = [], False
        while th.is_alive():
            seen_loading |= s.states()["slow"] == "loading"
            t0 = time.monotonic()
            r = s.complete("fast", max_tokens=4)
            lat.append(time.monotonic() - t0)
            assert r.status_code == 200, r.text
        th.join()
        assert slow_result["r"].status_code == 200, slow_result["r"].text
        assert seen_loading and slow_result["t"] >= 2.0, slow_result
        # the fast model kept answering all along: many requests, none waited for the slow load
        assert len(lat) >= 5 and max(lat) < slow_result["t"] / 2, (lat, slow_result["t"])
        assert s.admin_models()["slow"]["bytes"] == len(stories) + (16 << 20)  # sized once pulled
    finally:
        hub.close()


def test_kill_9_of_a_child_mid_request(models, slow_model):
    s = models(two_models(llama=slow_model))  # 400 tokens: about a second, cut after the first event
    assert s.complete("llama", max_tokens=2).status_code == 200
    pid = s.admin_models()["llama"]["pid"]
    body = {"model": "llama", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True,
            "ignore_eos": True}
    events = []
    with s.client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        buf = ""
        killed = False
        for text in resp.iter_text():
            buf += text
            while "\n\n" in buf:
                block, buf = buf.split("\n\n", 1)
                if block.startswith("data: "):
                    events.append(block[6:])
            if events and not killed:
                os.kill(pid, signal.SIGKILL)
                killed = True
    assert killed
    errs = [json.loads(e) for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert errs and is_openai_error(errs[-1]), events[-3:]
    n_text = sum(1 for e in events if e != "[DONE]" and "choices" in json.loads(e))
    assert n_text < 400  # cut short, and said so
    s.wait_state("llama", "unloaded")
    assert "child_died" in s.log() and f"pid {pid}" in s.log()
    assert s.metrics()['wafer_models_unloads_total{model="llama",reason="child_died"}'] == 1
    # a non-streamed request to a dead child: the next request reloads it
    r = s.complete("llama")
    assert r.status_code == 200, r.text
    assert s.admin_models()["llama"]["pid"] not in (None, pid)
    assert s.complete("tiny").status_code == 200  # the other model never noticed


def child_metric(s, model, name):
    port = s.admin_models()[model]["port"]
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def wait_child_metric(s, model, name, pred, timeout=20):
    deadline = time.time() + timeout
    v = None
    while time.time() < deadline:
        v = child_metric(s, model, name)
        if v is not None and pred(v):
            return v
        time.sleep(0.02)
    raise AssertionError(f"{model}'s {name} = {v}")


def test_kill_9_of_a_child_during_a_non_streamed_request(models, slow_model):
    # 400 tokens of the slow model run about a second: the kill lands while the request runs (llama-19M's ran
    # 80-100 ms, a few of the metric polls that look for it)
    s = models(two_models(llama=slow_model))
    assert s.complete("llama", max_tokens=2).status_code == 200
    pid = s.admin_models()["llama"]["pid"]
    out = {}
    th = threading.Thread(target=lambda: out.update(r=s.complete("llama", max_tokens=400, ignore_eos=True)))
    th.start()
    wait_child_metric(s, "llama", "wafer_requests_running", lambda v: v >= 1)
    os.kill(pid, signal.SIGKILL)
    th.join(60)
    r = out["r"]
    assert r.status_code == 502 and is_openai_error(r.json(), "upstream_error"), r.text
    s.wait_state("llama", "unloaded")
    assert s.complete("llama").status_code == 200


def test_a_client_that_leaves_frees_the_slot_on_the_model(models, slow_model):
    s = models(two_models(llama=slow_model))
    assert s.complete("llama", max_tokens=2).status_code == 200
    body = {"model": "llama", "prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=s.base, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=body) as resp:
            for _ in resp.iter_text():
                break  # the first bytes, then the client leaves
    wait_child_metric(s, "llama", "wafer_requests_running", lambda v: v == 0, timeout=10)
    assert child_metric(s, "llama", "wafer_requests_cancelled_total") >= 1
    assert s.admin_models()["llama"]["active"] == 0


def test_sigterm_stops_every_child(models):
    s = models(two_models())
    assert s.complete("tiny").status_code == 200 and s.complete("llama").status_code == 200
    pids = [m["pid"] for m in s.admin_models().values()]
    assert s.stop() == 0
    assert not any(pid_alive(p) for p in pids)
    assert "reason: shutdown" in s.log()


# ---- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize("yaml_text,where,what", [
    ("models:\n  - {name: a, path: x.gguf}\n  - {name: a, path: y.gguf}\n", ":3:", "used twice"),
    ("models:\n  - {name: a, path: x.gguf, kv_memry: 1GiB}\n", ":2:", "unknown key 'kv_memry'"),
    ("memory_budget: lots\nmodels:\n  - {name: a, path: x.gguf}\n", ":1:", "memory_budget"),
    ("models:\n  - {name: a}\n", ":2:", "no path"),
    ("models:\n  - {name: a, path: x.gguf}\nkeep_alive: soon\n", ":3:", "keep_alive"),
])
def test_a_bad_config_says_file_and_line(tmp_path, yaml_text, where, what):
    cfg = tmp_path / "m.yaml"
    cfg.write_text(yaml_text)
    r = subprocess.run([WAFER_BIN, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=20)
    assert r.returncode == 2, r.stderr
    assert str(cfg) + where in r.stderr and what in r.stderr, r.stderr


def test_models_dir_serves_every_gguf(tmp_path):
    need(STORIES)
    d = tmp_path / "dir"
    d.mkdir()
    os.symlink(STORIES, d / "one.gguf")
    os.symlink(STORIES, d / "two.gguf")
    (d / "notes.txt").write_text("not a model")
    p = subprocess.Popen([WAFER_BIN, "serve", "--models-dir", str(d), "--port", "0", "--threads", "1",
                          "--kv-memory", "16MiB"], stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.time() + 20
        while "listening on" not in line and time.time() < deadline:
            line = p.stderr.readline()
        base = line.split("listening on ")[1].split()[0]
        ids = {m["id"] for m in httpx.get(base + "/v1/models").json()["data"]}
        assert ids == {"one", "two"}
        r = httpx.post(base + "/v1/completions", json={"model": "two", "prompt": "Hi", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "two"
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    r = subprocess.run([WAFER_BIN, "serve", "--models-dir", str(tmp_path / "nope")], capture_output=True, text=True)
    assert r.returncode != 0 and "nope" in r.stderr
    r = subprocess.run([WAFER_BIN, "serve", "--models-dir", str(d), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "memory-budget" in r.stdout and "keep-alive" in r.stdout
