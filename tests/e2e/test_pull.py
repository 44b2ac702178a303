"""wafer pull / list / rm, and run / serve --model hf://..., against a stand-in of the Hugging Face hub on
loopback (hub_standin.py): quantization picking, redirects to a CDN, resumed downloads after cut
connections (in one run and across runs), a server that ignores Range, a wrong checksum, 401 and 404.
Each ends in a verified model or a clear error, never a half-installed model. The served GGUF is the
shared stories260K model, read at test time."""
import hashlib
import os
import subprocess

import httpx
import pytest

from conftest import STORIES, WAFER_BIN, need
from hub_standin import Hub

REPO = "wafer-test/stories-GGUF"


@pytest.fixture
def hub():
    h = Hub()
    yield h
    h.close()


@pytest.fixture
def stories():
    with open(need(STORIES), "rb") as f:
        return f.read()


def wafer(args, models, hub=None, token=None, timeout=30, **kw):
    env = dict(os.environ)
    env.pop("HF_TOKEN", None)
    env["WAFER_MODELS"] = str(models)
    env["HF_ENDPOINT"] = hub.url if hub else "http://127.0.0.1:9"
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([WAFER_BIN] + args, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def installed(models):
    """Every file under the models directory (relative paths), partial downloads included."""
    out = []
    for root, _, files in os.walk(models):
        out += [os.path.relpath(os.path.join(root, f), models) for f in files]
    return sorted(out)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def test_pull_by_quant_then_run_offline(hub, stories, tmp_path):
    hub.add(REPO, {"stories260K-Q8_0.gguf": stories, "stories260K-F16.gguf": stories + b"\0" * 64,
                   "README.md": b"# stories\n"})
    models = tmp_path / "models"
    r = wafer(["pull", REPO + ":q8_0"], models, hub)
    assert r.returncode == 0, r.stderr
    path = models / "wafer-test" / "stories-GGUF" / "stories260K-Q8_0.gguf"
    assert r.stdout.strip() == str(path)
    assert path.read_bytes() == stories
    assert installed(models) == ["wafer-test/stories-GGUF/stories260K-Q8_0.gguf"]  # no .part left behind
    assert "installed" in r.stderr and sha(stories) in r.stderr
    # as huggingface_hub: the tree listing, a HEAD on resolve (not followed), a GET that follows the 302 to
    # the CDN, which never sees the token
    api = [(x["method"], x["path"].split("?")[0]) for x in hub.records if x["server"] == "api"]
    assert api[0] == ("GET", "/api/models/%s/tree/main" % REPO)
    assert ("HEAD", "/%s/resolve/main/stories260K-Q8_0.gguf" % REPO) in api
    assert ("GET", "/%s/resolve/main/stories260K-Q8_0.gguf" % REPO) in api
    assert len(hub.cdn_requests()) == 1

    # run with the hf:// name generates what the file itself generates, without asking the hub again
    n_before = len(hub.records)
    gen = ["--prompt", "Once upon a time", "-n", "12", "--temperature", "0", "--threads", "1"]
    a = wafer(["run", "--model", "hf://%s:Q8_0" % REPO] + gen, models, hub)
    b = wafer(["run", "--model", STORIES] + gen, models, hub)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and len(a.stdout.strip()) > 10
    assert len(hub.records) == n_before

    # pulling again is a no-op; --force downloads again
    r = wafer(["pull", "hf://%s:Q8_0" % REPO], models, hub)
    assert r.returncode == 0 and "already pulled" in r.stderr
    assert len(hub.cdn_requests()) == 1
    r = wafer(["pull", "--force", "--quiet", REPO + "/stories260K-Q8_0.gguf"], models, hub)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert len(hub.cdn_requests()) == 2

    # list and rm
    r = wafer(["list"], models)
    assert r.returncode == 0
    line = [l for l in r.stdout.splitlines() if "stories260K-Q8_0.gguf" in l][0]
    assert line.startswith("wafer-test/stories-GGUF/stories260K-Q8_0.gguf") and "1.1 MiB" in line
    r = wafer(["list", "--json"], models)
    import json
    j = json.loads(r.stdout)
    assert j["models"][0]["size"] == len(stories) and j["models"][0]["path"] == str(path)
    assert j["models"][0]["quant"] != ""
    r = wafer(["rm", REPO + ":Q8_0"], models)
    assert r.returncode == 0 and "removed" in r.stdout
    assert installed(models) == []
    assert not (models / "wafer-test").exists()  # empty folders go too
    r = wafer(["rm", REPO + ":Q8_0"], models)
    assert r.returncode == 1 and "no model" in r.stderr


def test_run_pulls_a_missing_model(hub, stories, tmp_path):
    hub.add(REPO, {"stories260K.gguf": stories})  # one GGUF: no quant needed
    models = tmp_path / "m"
    r = wafer(["run", "--model", "hf://" + REPO, "--prompt", "Once", "-n", "4", "--temperature", "0",
               "--threads", "1"], models, hub)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) > 0
    assert "installed" not in r.stdout  # only generated text on stdout
    assert (models / "wafer-test/stories-GGUF/stories260K.gguf").read_bytes() == stories


def test_serve_pulls_a_missing_model(hub, stories, tmp_path, make_server, monkeypatch):
    hub.add(REPO, {"stories260K-Q8_0.gguf": stories})
    monkeypatch.setenv("WAFER_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    s = make_server(None, "--model", "hf://%s:Q8_0" % REPO)
    r = s.client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200
    assert r.json()["model"] == "stories260K-Q8_0"
    assert len(hub.cdn_requests()) == 1


def test_quant_ambiguous_or_missing(hub, stories, tmp_path):
    hub.add(REPO, {"m-Q4_K_M.gguf": stories, "m-Q4_K_M-imat.gguf": stories + b"x", "m-Q8_0.gguf": stories,
                   "mmproj-m-f16.gguf": stories})
    models = tmp_path / "m"
    r = wafer(["pull", REPO + ":Q4_K_M"], models, hub)
    assert r.returncode == 1
    assert "2 GGUF files match 'Q4_K_M'" in r.stderr
    assert "m-Q4_K_M.gguf" in r.stderr and "m-Q4_K_M-imat.gguf" in r.stderr
    r = wafer(["pull", REPO + ":Q5_K_M"], models, hub)
    assert r.returncode == 1
    assert "no GGUF file for 'Q5_K_M'" in r.stderr and "m-Q8_0.gguf" in r.stderr and "mmproj" not in r.stderr
    assert installed(models) == []
    r = wafer(["pull", "not-a-spec"], models, hub)
    assert r.returncode == 2 and "OWNER/NAME:QUANT" in r.stderr


def test_tree_pagination(stories, tmp_path):
    h = Hub(page_size=2)
    try:
        h.add(REPO, {"a.md": b"a", "b.md": b"b", "c-Q8_0.gguf": stories})
        r = wafer(["pull", REPO + ":Q8_0"], tmp_path / "m", h)
        assert r.returncode == 0, r.stderr
        assert sum(1 for x in h.records if "/tree/" in x["path"]) == 2  # followed Link: rel="next"
    finally:
        h.close()


def test_resume_after_a_cut_in_one_run(hub, stories, tmp_path):
    repo = hub.add(REPO, {"s-Q8_0.gguf": stories})
    repo.faults.add("cut_once")
    repo.cut_bytes = 400_000
    models = tmp_path / "m"
    r = wafer(["pull", REPO + ":Q8_0"], models, hub)
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stderr
    cdn = hub.cdn_requests()
    assert [x["range"] for x in cdn] == [None, "bytes=400000-"]
    assert (models / "wafer-test/stories-GGUF/s-Q8_0.gguf").read_bytes() == stories
    assert installed(models) == ["wafer-test/stories-GGUF/s-Q8_0.gguf"]


def test_resume_across_runs(hub, stories, tmp_path):
    repo = hub.add(REPO, {"s-Q8_0.gguf": stories})
    repo.faults.add("cut_always")
    repo.cut_bytes = 300_000
    models = tmp_path / "m"
    r = wafer(["pull", "--retries", "1", REPO + ":Q8_0"], models, hub)
    assert r.returncode == 1
    assert "download failed after 2 attempts" in r.stderr and "resumes it" in r.stderr
    part = models / ".downloads" / (sha(stories) + ".part")
    assert installed(models) == [".downloads/%s.part" % sha(stories)]  # nothing installed
    assert part.stat().st_size == 600_000
    r = wafer(["list"], models)
    assert "no models" in r.stdout and "1 interrupted download" in r.stdout
    # the next run resumes where the last stopped
    repo.faults.clear()
    r = wafer(["pull", REPO + ":Q8_0"], models, hub)
    assert r.returncode == 0, r.stderr
    assert "resuming a partial download at 585.9 KiB" in r.stderr
    assert hub.cdn_requests()[-1]["range"] == "bytes=600000-"
    assert installed(models) == ["wafer-test/stories-GGUF/s-Q8_0.gguf"]
    assert (models / "wafer-test/stories-GGUF/s-Q8_0.gguf").read_bytes() == stories


def test_server_that_ignores_range_and_503(hub, stories, tmp_path):
    repo = hub.add(REPO, {"s-Q8_0.gguf": stories})
    repo.faults |= {"cut_once", "no_range"}
    models = tmp_path / "m"
    r = wafer(["pull", REPO + ":Q8_0"], models, hub)
    assert r.returncode == 0, r.stderr
    assert (models / "wafer-test/stories-GGUF/s-Q8_0.gguf").read_bytes() == stories
    repo2 = hub.add("wafer-test/busy", {"s-Q8_0.gguf": stories + b"\0" * 32})  # other bytes, other CDN blob
    repo2.faults.add("cdn_503_once")
    r = wafer(["pull", "wafer-test/busy:Q8_0"], models, hub)
    assert r.returncode == 0, r.stderr
    assert "HTTP 503" in r.stderr


def test_wrong_checksum_installs_nothing(hub, stories, tmp_path):
    repo = hub.add(REPO, {"s-Q8_0.gguf": stories})
    repo.faults.add("bad_sha")
    models = tmp_path / "m"
    r = wafer(["pull", REPO + ":Q8_0"], models, hub)
    assert r.returncode == 1
    assert "checksum mismatch" in r.stderr and "0" * 64 in r.stderr and sha(stories) in r.stderr
    assert installed(models) == []  # neither the model nor the (useless) partial download


def test_private_repo_401_and_token(hub, stories, tmp_path):
    hub.add(REPO, {"s-Q8_0.gguf": stories}, token="hf_secret")
    models = tmp_path / "m"
    r = wafer(["pull", REPO + ":Q8_0"], models, hub)
    assert r.returncode == 1
    assert "401" in r.stderr and "HF_TOKEN" in r.stderr
    r = wafer(["pull", REPO + ":Q8_0"], models, hub, token="hf_wrong")
    assert r.returncode == 1 and "refused the token in HF_TOKEN" in r.stderr
    assert installed(models) == []
    r = wafer(["pull", REPO + ":Q8_0"], models, hub, token="hf_secret")
    assert r.returncode == 0, r.stderr
    api = [x for x in hub.records if x["server"] == "api"]
    assert api[-1]["auth"] == "Bearer hf_secret"
    assert all(x["auth"] is None for x in hub.cdn_requests())  # the token stays with the hub


def test_not_found_404(hub, stories, tmp_path):
    hub.add(REPO, {"s-Q8_0.gguf": stories})
    models = tmp_path / "m"
    r = wafer(["pull", REPO + "/missing-Q8_0.gguf"], models, hub)
    assert r.returncode == 1
    assert "has no file 'missing-Q8_0.gguf'" in r.stderr and "404" in r.stderr
    r = wafer(["pull", "wafer-test/nope:Q8_0"], models, hub, token="hf_any")
    assert r.returncode == 1 and "repository wafer-test/nope not found" in r.stderr
    r = wafer(["pull", REPO + "@v9:Q8_0"], models, hub)
    assert r.returncode == 1 and "no revision 'v9'" in r.stderr
    r = wafer(["run", "--model", "hf://wafer-test/nope:Q8_0", "--prompt", "x"], models, hub)
    assert r.returncode == 1 and "401" in r.stderr
    assert installed(models) == []


def test_unreachable_hub(tmp_path):
    r = wafer(["pull", "--retries", "0", REPO + ":Q8_0"], tmp_path / "m")  # port 9: nothing listens
    assert r.returncode == 1 and "cannot reach http://127.0.0.1:9" in r.stderr


def test_failure_before_any_byte_leaves_nothing(hub, stories, tmp_path):
    repo = hub.add(REPO, {"s-Q8_0.gguf": stories})
    repo.faults.add("cdn_503_once")
    models = tmp_path / "m"
    r = wafer(["pull", "--retries", "0", REPO + ":Q8_0"], models, hub)
    assert r.returncode == 1 and "HTTP 503" in r.stderr
    assert installed(models) == []  # no empty partial download either
