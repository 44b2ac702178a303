"""One generation path: `wafer run` prints exactly what /v1/completions answers for the same request (greedy,
with and without stop strings, with penalties, and seeded sampling), because both go through the scheduler;
and --backend reaches the engine from run, perplexity, bench and serve (flag and YAML key)."""
import json
import os
import signal
import subprocess
import time

import httpx
import pytest

from conftest import LLAMA19M, SHARED, STORIES, WAFER_BIN, need

GOLDEN = os.path.join(SHARED, "golden", "stories260K_greedy.json")


def wafer(*args, timeout=300):
    return subprocess.run([WAFER_BIN, *args], capture_output=True, text=True, timeout=timeout)


def run_args(req):
    """`wafer run` flags for a /v1/completions body."""
    a = ["--prompt", req["prompt"], "--max-tokens", str(req["max_tokens"]), "--temperature", str(req["temperature"])]
    for s in req.get("stop", []):
        a += ["--stop", s]
    for key, flag in [("top_k", "--top-k"), ("top_p", "--top-p"), ("min_p", "--min-p"), ("seed", "--seed"),
                      ("repeat_penalty", "--repeat-penalty"), ("frequency_penalty", "--frequency-penalty"),
                      ("presence_penalty", "--presence-penalty"), ("repeat_last_n", "--repeat-last-n")]:
        if key in req:
            a += [flag, str(req[key])]
    return a


def prompts():
    if not os.path.exists(GOLDEN):
        return ["Once upon a time", "The little dog was very"]
    return [e["prompt"] for e in json.load(open(GOLDEN))["entries"]]


def cases():
    out = []
    for i, p in enumerate(prompts()):
        out.append(("greedy-%d" % i, {"prompt": p, "max_tokens": 48, "temperature": 0}))
    # stop strings: one that occurs in the greedy text of the first prompts ("She", " park"), one that does
    # not, a stop string that spans tokens, and several at once
    out.append(("stop-she", {"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "stop": ["She"]}))
    out.append(("stop-park", {"prompt": "Lily and Tom went to the park", "max_tokens": 64, "temperature": 0,
                              "stop": ["box with", "nowhere-to-be-seen"]}))
    out.append(("stop-absent", {"prompt": "The little dog was very", "max_tokens": 40, "temperature": 0,
                                "stop": ["zebra"]}))
    out.append(("penalties", {"prompt": "Sam had a red ball. He", "max_tokens": 48, "temperature": 0,
                              "repeat_penalty": 1.3, "frequency_penalty": 0.5, "presence_penalty": 0.4,
                              "repeat_last_n": 32}))
    out.append(("seeded", {"prompt": "One day, a big bird", "max_tokens": 48, "temperature": 0.9, "top_k": 40,
                           "top_p": 0.95, "min_p": 0.05, "seed": 1234}))
    return out


@pytest.fixture(scope="module")
def server():
    from conftest import Server
    need(STORIES)
    s = Server(STORIES)
    yield s
    assert s.close() == 0


@pytest.mark.parametrize("name,req", cases(), ids=[c[0] for c in cases()])
def test_run_equals_completions(server, name, req):
    resp = httpx.post(server.url("/v1/completions"), json=req, timeout=60)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    r = wafer("run", "--model", STORIES, *run_args(req))
    assert r.returncode == 0, r.stderr
    assert r.stdout == choice["text"] + "\n", (r.stdout, choice["text"])
    assert ("finish: %s" % choice["finish_reason"]) in r.stderr
    assert ("generated: %d tokens" % resp.json()["usage"]["completion_tokens"]) in r.stderr
    if "stop" in req and name != "stop-absent":
        # the stop string really cut the text: it is not printed, and generation ended early
        assert choice["finish_reason"] == "stop"
        assert not any(s in r.stdout for s in req["stop"])


@pytest.mark.parametrize("name", ["greedy-0", "stop-she", "penalties", "seeded"])
def test_run_speculation_prints_the_same(name):
    """`wafer run` with n-gram drafts or a prediction prints what it prints without (drafts verified whole, so
    the verify path really runs)."""
    need(STORIES)
    req = dict(cases())[name]
    plain = wafer("run", "--model", STORIES, *run_args(req))
    assert plain.returncode == 0, plain.stderr
    text = plain.stdout[:-1]
    edited = text.replace(" a ", " the ")
    for extra in (["--spec", "ngram", "--draft-fixed"], ["--prediction", text, "--draft-fixed"],
                  ["--draft-model", STORIES, "--draft-fixed"], ["--spec", "draft", "--draft-model", STORIES],
                  ["--prediction", edited, "--draft-max", "4", "--draft-min", "2", "--draft-fixed"],
                  ["--prediction", text]):
        r = wafer("run", "--model", STORIES, *run_args(req), *extra)
        assert r.returncode == 0, r.stderr
        assert r.stdout == plain.stdout, (extra, r.stdout, plain.stdout)
        if extra[0] == "--prediction" and extra[-1] == "--draft-fixed" and len(text) > 8:
            assert "drafted:" in r.stderr, r.stderr
        if extra[0] == "--draft-model" and name == "greedy-0":  # the model drafting for itself, greedy:
            # every drafted token accepted (a stop string or sampling may end or reject a draft)
            assert "drafted:" in r.stderr and "accepted (100%)" in r.stderr, r.stderr
    r = wafer("run", "--model", STORIES, "--prompt", "x", "--spec", "draft")
    assert r.returncode == 2 and "--spec draft needs --draft-model FILE" in r.stderr, r.stderr
    r = wafer("run", "--model", STORIES, "--prompt", "x", "--spec", "medusa")
    assert r.returncode == 2 and "--spec: 'medusa' is not a draft source (off, ngram, draft)" in r.stderr, r.stderr


def test_run_draft_model_vocabulary_refused():
    """A draft model with another vocabulary is refused before anything is generated, both named."""
    need(STORIES)
    need(LLAMA19M)
    r = wafer("run", "--model", LLAMA19M, "--draft-model", STORIES, "--prompt", "Once", "--max-tokens", "4")
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""
    assert "another vocabulary (llama, 512 tokens)" in r.stderr and "(llama, 32000 tokens)" in r.stderr, r.stderr


def test_stop_string_is_the_servers(server):
    """The cut falls where the server cuts, not at a token boundary of run's own making: the text before the
    stop string is printed whole, the stop string and what follows are not."""
    req = {"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0}
    full = wafer("run", "--model", STORIES, *run_args(req))
    assert full.returncode == 0
    i = full.stdout.index("park")
    cut = wafer("run", "--model", STORIES, *run_args(dict(req, stop=["park"])))
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout == full.stdout[:i] + "\n"


@pytest.mark.parametrize("backend", ["cpu", "scalar"])
def test_run_backend_greedy_golden(backend):
    need(STORIES)
    if not os.path.exists(GOLDEN):
        pytest.skip("golden file missing")
    for e in json.load(open(GOLDEN))["entries"]:
        r = wafer("run", "--model", STORIES, "--prompt", e["prompt"], "--max-tokens", str(e["n_generated"]),
                  "--temperature", "0", "--backend", backend)
        assert r.returncode == 0, r.stderr
        assert r.stdout == e["generated_text"] + "\n"
        assert "backend %s" % backend in r.stderr


def test_unknown_backend_is_refused():
    need(STORIES)
    for cmd in (["run", "--model", STORIES, "--prompt", "x"], ["perplexity", "--model", STORIES, "--file", GOLDEN],
                ["bench", "--model", STORIES, "-p", "8", "-n", "8", "--no-membw"]):
        r = wafer(*cmd, "--backend", "nope")
        assert r.returncode == 2, (cmd, r.stderr)
        assert "--backend: unknown backend 'nope' (available: cpu, scalar)" in r.stderr, r.stderr
    r = wafer("serve", "--model", STORIES, "--port", "0", "--backend", "nope", timeout=30)
    assert r.returncode == 2 and "unknown backend 'nope'" in r.stderr, r.stderr


def test_perplexity_backend_scalar_equals_llama_cpp():
    need(LLAMA19M)
    cases = json.load(open(os.path.join(SHARED, "golden", "perplexity.json")))["cases"]
    case = next(c for c in cases if "19M-Q8_0" in c["model"])
    r = wafer("perplexity", "--model", os.path.join(SHARED, case["model"].split()[0]), "--file",
              os.path.join(SHARED, "golden", "story.txt"), "--ctx", str(case["ctx"]), "--json", "--backend", "scalar")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])["perplexity"]
    assert abs(got - case["ppl"]) / case["ppl"] < 0.01, (got, case["ppl"])


def test_bench_backend_scalar():
    need(STORIES)
    r = wafer("bench", "--model", STORIES, "-p", "16", "-n", "8", "-r", "1", "--no-membw", "--backend", "scalar",
              "--json")
    assert r.returncode == 0, r.stderr
    assert "scalar kernels" in r.stderr


def test_serve_backend_scalar(make_server, tmp_path):
    req = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
    s = make_server(STORIES, "--backend", "scalar")
    assert "backend scalar" in s.log()
    a = httpx.post(s.url("/v1/completions"), json=req, timeout=60)
    assert a.status_code == 200, a.text
    r = wafer("run", "--model", STORIES, *run_args(req))
    assert r.stdout == a.json()["choices"][0]["text"] + "\n"
    cfg = tmp_path / "wafer.yaml"
    cfg.write_text(f"model:\n  path: {STORIES}\nserver:\n  backend: scalar\n")
    s2 = make_server(None, "--config", str(cfg))
    assert "backend scalar" in s2.log()
    b = httpx.post(s2.url("/v1/completions"), json=req, timeout=60)
    assert b.status_code == 200 and b.json()["choices"][0]["text"] == a.json()["choices"][0]["text"]


def test_run_sigint_cancels():
    """Ctrl-C stops a long generation: what was generated is printed, the exit status is 130."""
    need(LLAMA19M)
    p = subprocess.Popen([WAFER_BIN, "run", "--model", LLAMA19M, "--prompt", "Once upon a time", "--max-tokens",
                          "4000", "--ctx-size", "4096", "--ignore-eos", "--backend", "scalar", "--threads", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # wait until it streams, then interrupt
    first = p.stdout.read(1)
    assert first, p.stderr.read()
    t0 = time.time()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert time.time() - t0 < 10
    assert p.returncode == 130, err
    assert "interrupted after" in err
    assert len(first + out) > 1
