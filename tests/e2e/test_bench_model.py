"""End-to-end checks of `wafer bench --model` / `wafer bench --membw` (the engine benchmark) as a user runs it:
the table, the JSON last line with the documented fields, skipped parts, and usage errors."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import LLAMA19M
from models_server import pid_alive

WAFER = os.environ.get("WAFER_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "wafer"))
SHARED = os.environ.get("WAFER_SHARED", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared"))
STORIES = os.path.join(SHARED, "models", "stories260K", "stories260K.gguf")
need_llama19m = pytest.mark.skipif(not os.path.exists(LLAMA19M), reason=f"shared model {LLAMA19M} not found (set WAFER_SHARED)")
need_stories = pytest.mark.skipif(not os.path.exists(STORIES), reason=f"shared model {STORIES} not found (set WAFER_SHARED)")

FIELDS = ["model_bytes", "threads", "pp_tps", "tg_tps", "tg_gbs", "membw_gbs", "tg_roofline_pct", "batch",
          "batch_tps", "peak_rss_bytes"]


def bench(*args):
    return subprocess.run([WAFER, "bench", *args], capture_output=True, text=True, timeout=120)


@need_stories
def test_bench_json_all_parts():
    r = bench("--model", STORIES, "-p", "32", "-n", "8", "-r", "2", "-t", "2", "--batch", "3", "--membw-mib", "32", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    for f in FIELDS:
        assert f in j, f
    assert j["threads"] == 2 and j["batch"] == 3 and j["n_prompt"] == 32 and j["n_gen"] == 8
    assert j["model_bytes"] == os.path.getsize(STORIES)
    assert j["pp_tps"] > 0 and j["tg_tps"] > 0 and j["batch_tps"] > 0 and j["membw_gbs"] > 0
    assert j["tg_gbs"] == pytest.approx(j["tg_tps"] * j["weight_bytes"] / 1e9, rel=1e-4)
    assert j["tg_roofline_pct"] == pytest.approx(100 * j["tg_gbs"] / j["membw_gbs"], rel=1e-4)
    # three probes beside the two tg repetitions (before the first, after each): their mean and the median
    # share of each repetition against the two probes around it
    assert j["membw_beside_gbs"] > 0 and j["tg_beside_pct"] > 0
    assert "% of the probes beside each repetition" in r.stderr
    if len(os.sched_getaffinity(0)) >= 2:  # the cores' round trip before and after the tg repetitions
        assert j["core_round_trip_ns_before"] > 1 and j["core_round_trip_ns_after"] > 1
        assert "core round trip:" in r.stderr
    assert j["peak_rss_bytes"] > j["model_bytes"]
    assert "| pp32 |" in r.stdout and "| tg8 |" in r.stdout and "| tg8 x3 |" in r.stdout
    assert "beside," in r.stdout
    assert "peak RSS" in r.stderr


@need_stories
def test_bench_skips_parts():
    r = bench("--model", STORIES, "-p", "0", "-n", "4", "-r", "1", "--no-membw", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["pp_tps"] is None and j["tg_tps"] > 0 and j["membw_gbs"] is None and j["tg_roofline_pct"] is None
    assert j["membw_beside_gbs"] is None and j["tg_beside_pct"] is None and "beside" not in r.stderr
    assert j["core_round_trip_ns_before"] is None and "core round trip" not in r.stderr
    assert j["batch_tps"] is None
    r = bench("--model", STORIES, "-p", "8", "-n", "0", "-r", "1", "--no-membw", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["pp_tps"] > 0 and j["tg_tps"] is None and j["tg_gbs"] is None
    # no generation: the probe runs once, before loading, and nothing is probed beside
    r = bench("--model", STORIES, "-p", "8", "-n", "0", "-r", "1", "--membw-mib", "16", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["membw_gbs"] > 0 and j["membw_beside_gbs"] is None and j["tg_beside_pct"] is None


def children(pid):
    """Processes whose parent is pid (from /proc/N/stat: the field after the command's closing parenthesis)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[1]) == pid:
                out.append(int(d))
    return out


@need_llama19m
def test_bench_probe_killed():
    """The probe process killed with SIGKILL during generation: the benchmark finishes, says so, and reports
    no share beside generation instead of dying (SIGPIPE) or hanging."""
    p = subprocess.Popen([WAFER, "bench", "--model", LLAMA19M, "-p", "0", "-n", "500", "-r", "100", "-t", "1",
                          "--membw-mib", "1", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        child = None
        for _ in range(200):  # the probe is this process's only child
            kids = children(p.pid)
            if kids:
                child = kids[0]
                break
            time.sleep(0.05)
        assert child, "no probe process found"
        # into generation (the model loads in milliseconds); 100 repetitions of about 0.1 s each leave many
        # after the kill even on a CPU several times faster (40 left too few for a 3.5x faster one)
        time.sleep(1.0)

        def wchan(pid):  # the kernel function the main thread sleeps in, "0" while it runs
            with open(f"/proc/{pid}/wchan") as f:
                return f.read()

        # Kill it while it waits for the next request and the benchmark runs a repetition (about 0.1 s; the
        # probe's round trip takes well under a millisecond), then wait until it has exited (a zombie: its
        # pipe ends closed) while that repetition still runs. The next request then meets a closed pipe.
        # Killed while a reply was awaited, or written before the exit closed the pipe, the benchmark would
        # only see the reply's pipe end, which a SIGPIPE regression survives.
        for _ in range(2000):
            if "pipe" in wchan(child) and wchan(p.pid) == "0":
                break
            time.sleep(0.001)
        os.kill(child, signal.SIGKILL)
        for _ in range(2000):
            if not pid_alive(child):
                break
            time.sleep(0.0005)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "bandwidth probe beside generation failed" in err
    j = json.loads(out.strip().splitlines()[-1])
    assert j["tg_tps"] > 0 and j["membw_gbs"] > 0 and j["tg_beside_pct"] is None


def test_bench_membw_only():
    r = bench("--membw", "--membw-mib", "16", "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert "read bandwidth:" in r.stdout
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["membw_gbs"] > 0 and j["threads"] == 1 and j["buffer_bytes"] == 16 << 20
    # the cores' round trip beside it (CI machines have two CPUs; one alone gets null and a message)
    if len(os.sched_getaffinity(0)) >= 2:
        assert "core round trip:" in r.stdout and 1 < j["core_round_trip_ns"] < 1e6
    else:
        assert j["core_round_trip_ns"] is None and "two CPUs" in r.stderr


def test_bench_stream():
    """`--stream TYPE`: the decode kernels over a 1B model's matrices against a plain read, and (since stop 41)
    the same arithmetic from cache; the JSON line carries all three, and the figures agree with each other."""
    r = bench("--stream", "q4_0", "--threads", "2", "--batch", "8", "-r", "2", "--json")
    if r.returncode == 2 and "no decode kernel" in r.stderr:
        pytest.skip("no AVX2 here: no decode kernels to measure")
    assert r.returncode == 0, r.stderr
    assert "kernels / read" in r.stdout and "the same arithmetic from cache" in r.stdout
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["type"] == "q4_0" and j["batch"] == 8 and j["threads"] == 2 and j["passes"] == 2
    assert j["read_gbs"] > 0 and j["kernel_gbs"] > 0 and j["cache_gbs"] > 0
    assert 64 <= j["cache_kib"] <= 512
    # the kernel and from-cache passes do the same multiply-adds over the same bytes (the latter as counted
    # while its calls ran)
    assert j["macs_per_pass"] > 0 and j["cache_macs_per_pass"] == j["macs_per_pass"]
    assert j["kernel_gmacs"] / j["kernel_gbs"] == pytest.approx(j["cache_gmacs"] / j["cache_gbs"], rel=1e-6)
    r = bench("--stream", "bogus")
    assert r.returncode == 2 and "is not a weight type" in r.stderr
    r = bench("--stream", "q5_0")
    assert r.returncode == 2 and "no decode kernel for q5_0" in r.stderr
    r = bench("--stream", "q4_0", "--batch", "65")
    assert r.returncode == 2 and "1-64" in r.stderr


def bench_env(env, *args):
    return subprocess.run([WAFER, "bench", *args], capture_output=True, text=True, timeout=120, env=env)


def test_bench_tune(tmp_path):
    """`--tune` (stop 42): every decode prefetch rule of a type measured against the built-in one in the same
    rounds, the choice by the documented margin, the tune file written (its folder made) with what the table
    says; a later process applies a tune file for its own CPU (`--stream` says which rule ran and from where),
    ignores one from another CPU with a warning, and none at all with WAFER_TUNE_FILE empty; refusals."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("WAFER_GEMV_PREFETCH", "WAFER_PREFETCH_NTA", "WAFER_TUNE_FILE")}
    path = tmp_path / "cache" / "wafer" / "tune.json"
    r = bench_env(clean, "--tune", "--tune-types", "q4_0,q4_k", "-r", "2", "-t", "2", "--tune-file", str(path),
                  "--json")
    if r.returncode == 2 and "portable scalar" in r.stderr:
        pytest.skip("no AVX2 here: no decode rules to choose")
    assert r.returncode == 0, r.stderr
    assert "built-in" in r.stdout and f"wrote {path}" in r.stdout
    # the hint to run --tune, not while it runs (the hint only exists on a CPU without built-in rules)
    assert "measures this CPU's" not in r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(j["types"]) == {"q4_0", "q4_k"} and j["threads"] == 2 and j["rounds"] == 2
    assert j["isa"] in ("avx512", "avx-vnni", "avx2") and j["tune_file"] == str(path)
    if len(os.sched_getaffinity(0)) >= 2:  # the placement check: the round trip before and after
        assert len(j["core_round_trip_ns"]) == 2 and min(j["core_round_trip_ns"]) > 0
        assert "core round trip:" in r.stdout
    for t, f in j["types"].items():
        rules = f["rule_gbs"]
        # AVX2: every, sparse, and Q4_0 / Q8_0 twin, the K-quants spread; AVX-512 also nta and twin (not Q6_K)
        assert len(rules) == (3 if j["isa"] in ("avx2", "avx-vnni") else 5 if t == "q4_k" else 4), t
        assert set(rules) <= {"every", "nta", "sparse", "spread", "twin"} and all(v > 0 for v in rules.values())
        assert set(f["vs_builtin"]) == set(rules) and f["vs_builtin"][f["builtin"]] == 1.0
        best = max(f["vs_builtin"], key=f["vs_builtin"].get)
        assert f["chosen"] == (best if f["vs_builtin"][best] >= 1.05 else f["builtin"]), f
    tf = json.loads(path.read_text())
    assert tf["version"] == 2 and tf["cpu"] == j["cpu"] and tf["isa"] == j["isa"] and tf["threads"] == 2
    assert tf["decode_prefetch"] == {t: f["chosen"] for t, f in j["types"].items()}
    assert tf["figures"]["q4_k"]["rule_gbs"] == j["types"]["q4_k"]["rule_gbs"]

    # `wafer bench --model` runs with the saved rules and says so (the JSON too)
    if os.path.exists(LLAMA19M):
        r = bench_env({**clean, "WAFER_TUNE_FILE": str(path)}, "--model", LLAMA19M, "-p", "0", "-n", "2", "-r", "1",
                      "-t", "2", "--no-membw", "--json")
        assert r.returncode == 0, r.stderr
        jm = json.loads(r.stdout.strip().splitlines()[-1])
        assert jm["decode_prefetch_source"] == f"tune file {path}" and f"(tune file {path})" in r.stderr
        assert f"q4_0 {tf['decode_prefetch']['q4_0']}" in jm["decode_prefetch"]
        assert f"decode prefetch rules from tune file {path}" in r.stderr  # the backend's log line
    # a tune file with another rule than the built-in one for q4_k: a later process runs that rule
    builtin = j["types"]["q4_k"]["builtin"]
    other = next(k for k in j["types"]["q4_k"]["rule_gbs"] if k != builtin)
    tf["decode_prefetch"]["q4_k"] = other
    forced = tmp_path / "forced.json"
    forced.write_text(json.dumps(tf))
    r = bench_env({**clean, "WAFER_TUNE_FILE": str(forced)}, "--stream", "q4_k", "-r", "1", "-t", "2", "--json")
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout.strip().splitlines()[-1])
    assert js["decode_prefetch"] == other and js["decode_prefetch_source"] == f"tune file {forced}"
    assert f"decode prefetch: {other} (tune file {forced})" in r.stderr
    # WAFER_TUNE_FILE set but empty: no tune file, the built-in rule
    r = bench_env({**clean, "WAFER_TUNE_FILE": ""}, "--stream", "q4_k", "-r", "1", "-t", "2", "--json")
    js = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and js["decode_prefetch"] == builtin and js["decode_prefetch_source"] == "built-in rules"
    # measured on another CPU: said so, not applied
    tf["cpu"] = "Another CPU (family 6 model 207)"
    forced.write_text(json.dumps(tf))
    r = bench_env({**clean, "WAFER_TUNE_FILE": str(forced)}, "--stream", "q4_k", "-r", "1", "-t", "2", "--json")
    js = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and js["decode_prefetch"] == builtin and js["decode_prefetch_source"] == "built-in rules"
    assert "was measured on Another CPU" in r.stderr

    r = bench_env(clean, "--tune", "--tune-types", "q5_0", "--no-save")
    assert r.returncode == 2 and "'q5_0' is not one of" in r.stderr
    r = bench_env({**clean, "WAFER_GEMV_PREFETCH": "every"}, "--tune", "--no-save", "-r", "1")
    assert r.returncode == 2 and "unset them" in r.stderr
    r = bench_env(clean, "--tune", "--no-save", "--tune-file", str(path))
    assert r.returncode == 2 and "--no-save saves nothing" in r.stderr
    r = bench_env(clean, "--tune-file", str(path))
    assert r.returncode == 2 and "go with --tune" in r.stderr
    r = bench_env(clean, "--tune", "--stream", "q4_0")
    assert r.returncode == 2 and "without a model" in r.stderr
    r = bench_env(clean, "--tune", "--batch", "8", "--no-save")
    assert r.returncode == 2 and "--batch does not apply" in r.stderr
    r = bench_env(clean, "--help")
    assert r.returncode == 0 and "wafer bench --tune" in r.stdout
    r = bench_env(clean, "--model", "x.gguf", "--help")
    assert r.returncode == 0 and "--tune-file PATH" in r.stdout and "--no-save" in r.stdout


def test_bench_usage_errors(tmp_path):
    r = bench("--help")
    assert r.returncode == 0 and "wafer bench --model M" in r.stdout and "wafer bench --membw" in r.stdout
    r = bench("--model", "x.gguf", "--help")
    assert r.returncode == 0 and "usage: wafer bench --model" in r.stdout
    # the help asked for where an option's value would go (`wafer bench <tool> --help`, as bench --help says)
    for tool in (["--model"], ["--stream"], ["--tune", "--tune-types"], ["-m", "x.gguf", "-p"]):
        r = bench(*tool, "--help")
        assert r.returncode == 0 and "usage: wafer bench --model" in r.stdout, (tool, r.stdout, r.stderr)
    r = bench("-p", "8")
    assert r.returncode == 2 and "--model is required" in r.stderr
    r = bench("--model", "x.gguf", "-p", "0", "-n", "0")
    assert r.returncode == 2 and "nothing to measure" in r.stderr
    r = bench("--model", "x.gguf", "-r", "0")
    assert r.returncode == 2 and "--repeat" in r.stderr
    r = bench("--model", str(tmp_path / "missing.gguf"), "--no-membw")
    assert r.returncode == 1 and "missing.gguf" in r.stderr


@need_stories
def test_bench_context_too_long():
    r = bench("--model", STORIES, "-p", "100000", "-n", "8", "--no-membw")
    assert r.returncode == 1 and "more than the model's context" in r.stderr


@need_stories
def test_bench_depth():
    """--depth D measures ppN and tgN after D tokens in the cache (llama-bench's -d): labelled "@ dD", the KV
    pool is sized for D more tokens, the JSON records the depth and the CPU it ran on."""
    base = bench("--model", STORIES, "-p", "16", "-n", "4", "-r", "1", "-t", "1", "--no-membw", "--json")
    r = bench("--model", STORIES, "-p", "16", "-n", "4", "-r", "1", "-t", "1", "--no-membw", "--json", "-d", "100")
    assert base.returncode == 0 and r.returncode == 0, r.stderr
    j0 = json.loads(base.stdout.strip().splitlines()[-1])
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j0["depth"] == 0 and j["depth"] == 100
    assert "| pp16 @ d100 |" in r.stdout and "| tg4 @ d100 |" in r.stdout and "@ d" not in base.stdout
    assert j["kv_bytes"] > 3 * j0["kv_bytes"]
    assert j["pp_tps"] > 0 and j["tg_tps"] > 0
    assert j["cpu"] and j["cpu"] != "unknown CPU" and "cpu:" in r.stderr
    r = bench("--model", STORIES, "-p", "16", "-n", "4", "-d", "100000", "--no-membw")
    assert r.returncode == 1 and "-d 100000" in r.stderr and "more than the model's context" in r.stderr
    r = bench("--model", STORIES, "-d", "-1")
    assert r.returncode == 2 and "--depth" in r.stderr


@need_stories
def test_bench_spec():
    """--spec: speculative decoding end to end, answers checked equal inside (a mismatch fails the run), the
    drafts counted; the draft model (here the model itself) accepts every greedy draft."""
    r = bench("--model", STORIES, "-n", "24", "-r", "2", "-t", "1", "--no-membw", "--spec", "exact", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    s = j["spec"]
    assert s["source"] == "exact" and s["speedup"] > 0 and s["plain_tps"] > 0 and s["spec_tps"] > 0
    assert 0 < s["accepted"] == s["drafted"], s
    assert j["pp_tps"] is None and j["tg_tps"] is None  # --spec replaces pp/tg
    assert "| spec exact tg24 |" in r.stdout and "spec exact round 2:" in " ".join(r.stderr.split())
    r = bench("--model", STORIES, "-n", "24", "-r", "1", "-t", "1", "--no-membw", "--spec", "draft",
              "--draft-model", STORIES, "--draft-fixed", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])["spec"]
    assert 0 < s["accepted"] == s["drafted"], s
    for src in ("half", "wrong", "ngram"):
        r = bench("--model", STORIES, "-n", "16", "-r", "1", "-t", "1", "--no-membw", "--spec", src)
        assert r.returncode == 0, (src, r.stderr)
    r = bench("--model", STORIES, "--spec", "draft")
    assert r.returncode == 2 and "--spec draft needs --draft-model FILE" in r.stderr
    r = bench("--model", STORIES, "--spec", "medusa")
    assert r.returncode == 2 and "'medusa' is not one of exact, half, wrong, ngram, draft" in r.stderr
