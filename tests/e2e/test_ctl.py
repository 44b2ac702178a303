"""wafer ctl against real servers: a one-model wafer serve and one in models mode. Tables and --json,
load / unload with and without the admin key, drain (the process exits after its requests finish), an
unreachable URL (exit 3, saying which URL and what to do), usage errors (exit 2)."""
import json
import os
import subprocess
import threading
import time

import pytest

from conftest import LLAMA19M, STORIES, WAFER_BIN, need
from models_server import ModelsServer


def ctl(*args, env=None, timeout=60):
    e = dict(os.environ)
    e.pop("WAFER_URL", None)
    e.pop("WAFER_API_KEY", None)
    e.update(env or {})
    return subprocess.run([WAFER_BIN, "ctl"] + list(args), capture_output=True, text=True, timeout=timeout, env=e)


@pytest.fixture
def models_server(tmp_path):
    need(STORIES)
    need(LLAMA19M)
    s = ModelsServer(tmp_path, f"auth: {{admin_keys: [sk-admin]}}\nmodels:\n"
                               f"  - {{name: storyteller, path: {STORIES}, aliases: [tiny], kv_memory: 16MiB}}\n"
                               f"  - {{name: llama, path: {LLAMA19M}, kv_memory: 32MiB}}\n", admin_key="sk-admin")
    yield s
    s.close()


def test_status_and_models_of_a_models_server(models_server):
    s = models_server
    r = ctl("--url", s.base, "status")
    assert r.returncode == 0, r.stderr
    assert "models (one child server per loaded model)" in r.stdout and "0 of 2 loaded" in r.stdout
    assert "storyteller" in r.stdout and "unloaded" in r.stdout and "version" in r.stdout
    # load through ctl: the key from the environment, the model by its alias; ctl waits until loaded
    r = ctl("--url", s.base, "load", "tiny", env={"WAFER_API_KEY": "sk-admin"})
    assert r.returncode == 0 and r.stdout.strip() == "tiny: loaded", (r.stdout, r.stderr)
    r = ctl("--url", s.base, "--api-key", "sk-admin", "status", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["mode"] == "models" and j["ready"] is True and j["loaded"] == 1
    assert j["health"]["version"] and "in_flight" in j["load"]
    by = {m["name"]: m for m in j["models"]}
    assert by["storyteller"]["state"] == "loaded" and by["llama"]["state"] == "unloaded"
    r = ctl("--url", s.base, "--api-key", "sk-admin", "models")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[0].split()[:3] == ["NAME", "STATE", "SIZE"]
    row = next(l for l in lines if l.startswith("storyteller"))
    assert "loaded" in row and "MiB" in row and "tiny" in row
    r = ctl("--url", s.base, "models", "--json")  # no key: the public list
    assert r.returncode == 0 and {m["name"]: m["state"] for m in json.loads(r.stdout)["models"]} == \
        {"storyteller": "loaded", "llama": "unloaded"}
    r = ctl("--url", s.base, "--api-key", "sk-admin", "unload", "storyteller", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] in ("unloading", "unloaded")
    s.wait_state("storyteller", "unloaded")


def test_admin_commands_need_the_admin_key(models_server):
    s = models_server
    r = ctl("--url", s.base, "load", "llama")
    assert r.returncode == 1 and "HTTP 401" in r.stderr and "--api-key" in r.stderr
    r = ctl("--url", s.base, "--api-key", "wrong", "unload", "llama")
    assert r.returncode == 1 and "HTTP 401" in r.stderr
    r = ctl("--url", s.base, "drain")
    assert r.returncode == 1 and "HTTP 401" in r.stderr
    assert s.proc.poll() is None  # still running
    r = ctl("--url", s.base, "--api-key", "sk-admin", "load", "nope")
    assert r.returncode == 1 and "nope" in r.stderr and "storyteller" in r.stderr
    assert s.states() == {"storyteller": "unloaded", "llama": "unloaded"}


def test_status_of_a_one_model_server(make_server):
    srv = make_server(STORIES)
    r = ctl("--url", srv.base, "status")
    assert r.returncode == 0, r.stderr
    assert "one model" in r.stdout and "1 of 1 loaded: stories260K" in r.stdout
    assert "running" in r.stdout and "slots" in r.stdout
    j = json.loads(ctl("--url", srv.base, "status", "--json").stdout)
    assert j["mode"] == "single" and j["load"]["running"] == 0 and j["load"]["slots"] >= 1
    assert j["load"]["kv_blocks_total"] > 0
    r = ctl("--url", srv.base, "load", "x")
    assert r.returncode == 1 and "models mode" in r.stderr


def test_drain_finishes_in_flight_work_then_the_server_exits(make_server, slow_model):
    # 400 tokens of the slow model run about a second: the metric polls see the request, and the drain lands
    # while it runs (llama-19M's 200 tokens ran 40-50 ms, which a 30 ms poll could miss)
    srv = make_server(slow_model)
    out = {}

    def long_request():
        out["r"] = srv.client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 400, "temperature": 0,
                                                            "ignore_eos": True})

    th = threading.Thread(target=long_request)
    th.start()
    srv.wait_metric("wafer_requests_running", lambda v: v >= 1)
    r = ctl("--url", srv.base, "drain")
    assert r.returncode == 0 and "draining" in r.stdout, r.stderr
    th.join(60)
    assert out["r"].status_code == 200 and out["r"].json()["usage"]["completion_tokens"] == 400
    assert srv.proc.wait(30) == 0
    assert "POST /admin/drain" in srv.log()


def test_drain_with_admin_keys_on_serve(make_server):
    srv = make_server(STORIES, "--admin-key", "sk-a")
    r = ctl("--url", srv.base, "drain")
    assert r.returncode == 1 and "HTTP 401" in r.stderr
    time.sleep(0.2)
    assert srv.proc.poll() is None
    r = ctl("--url", srv.base, "--api-key", "sk-a", "drain", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "draining"
    assert srv.proc.wait(30) == 0


def test_drain_of_a_models_server_stops_its_children(models_server):
    s = models_server
    assert s.complete("tiny").status_code == 200
    pid = s.admin_models()["storyteller"]["pid"]
    r = ctl("--url", s.base, "--api-key", "sk-admin", "drain")
    assert r.returncode == 0, r.stderr
    assert s.proc.wait(30) == 0
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_unreachable_server_and_usage_errors():
    r = ctl("--url", "http://127.0.0.1:9", "status")
    assert r.returncode == 3
    assert "http://127.0.0.1:9" in r.stderr and "--url" in r.stderr and "WAFER_URL" in r.stderr
    r = ctl("status", env={"WAFER_URL": "http://127.0.0.1:9/"})
    assert r.returncode == 3 and "http://127.0.0.1:9:" in r.stderr
    assert ctl().returncode == 2
    assert ctl("frobnicate").returncode == 2
    assert ctl("load").returncode == 2
    assert ctl("status", "extra").returncode == 2
    assert ctl("--url", "ftp://x", "status").returncode == 2
    r = ctl("--help")
    assert r.returncode == 0 and "exit status" in r.stdout and "drain" in r.stdout
