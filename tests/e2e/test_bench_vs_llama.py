"""scripts/bench_vs_llama.py (`make bench-vs-llama`): the table it prints from real `wafer bench` runs and
llama-bench's JSON. llama.cpp is not built on the test machine, so a stand-in prints llama-bench's JSON
(the fields the script reads, in the format llama-bench c392e50 writes with `-o json`) with a different
speed each round; the test checks the table against the raw results the script saved."""
import json
import os
import re
import statistics
import subprocess
import sys

import pytest

from conftest import REPO, STORIES, WAFER_BIN

STAND_IN = r'''#!{python}
# llama-bench stand-in: -m M -p P -n N -r R -t T -o json; round k (a counter file) reports k * 1000 tok/s
import json, os, sys
a = sys.argv
p, n = int(a[a.index("-p") + 1]), int(a[a.index("-n") + 1])
cnt = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rounds")
k = int(open(cnt).read()) + 1 if os.path.exists(cnt) else 1
open(cnt, "w").write(str(k))
def entry(np_, ng, ts):
    return {"build_commit": "unknown", "cpu_info": "stand-in", "model_filename": a[a.index("-m") + 1],
            "n_threads": int(a[a.index("-t") + 1]), "n_prompt": np_, "n_gen": ng, "avg_ts": ts, "stddev_ts": 0.0}
out = []
if p:
    out.append(entry(p, 0, 2000.0 * k))
if n:
    out.append(entry(0, n, 1000.0 * k))
print(json.dumps(out, indent=2))
'''


@pytest.mark.skipif(not os.path.exists(STORIES), reason=f"shared model {STORIES} not found (set WAFER_SHARED)")
def test_table_from_rounds(tmp_path):
    lb = tmp_path / "llama-bench"
    lb.write_text(STAND_IN.replace("{python}", sys.executable, 1))
    lb.chmod(0o755)
    raw = tmp_path / "raw.json"
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_vs_llama.py"), "--wafer", WAFER_BIN,
                        "--llama", f"standin={lb}", "-t", "1", "-p", "16", "-n", "16", "-r", "1", "--rounds", "3",
                        "--batch", "2", "--json", str(raw), STORIES], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("stories260K.gguf wafer: pp") == 3 and r.stderr.count("stories260K.gguf standin: pp") == 3
    lines = r.stdout.splitlines()
    hdr = next(l for l in lines if l.startswith("| model"))
    row = next(l for l in lines if l.startswith("| stories260K.gguf"))
    cols = [c.strip() for c in hdr.strip("|").split("|")]
    cells = dict(zip(cols, [c.strip() for c in row.strip("|").split("|")]))
    assert len(cols) == len(row.strip("|").split("|"))
    data = json.loads(raw.read_text())["stories260K.gguf"]
    ws, ls = data["wafer"], data["standin"]
    assert [x["tg_tps"] for x in ls] == [1000.0, 2000.0, 3000.0]
    for key, col in (("pp_tps", "pp wafer/standin"), ("tg_tps", "tg wafer/standin")):
        rs = [w[key] / x[key] for w, x in zip(ws, ls)]
        m = re.fullmatch(r"([0-9.]+)x \(([0-9.]+)-([0-9.]+)x\)", cells[col])
        assert m, cells[col]
        assert float(m.group(1)) == pytest.approx(statistics.median(rs), abs=0.006)
        assert float(m.group(2)) == pytest.approx(min(rs), abs=0.006)
        assert float(m.group(3)) == pytest.approx(max(rs), abs=0.006)
    # each program's best round
    assert float(cells["standin tg"]) == 3000.0 and float(cells["standin pp"]) == 6000.0
    assert float(cells["wafer tg"]) == pytest.approx(max(w["tg_tps"] for w in ws), abs=0.006)
    assert cells["batch gain"].endswith("x") and cells["wafer tg % bw beside"].endswith("%")


# llama-batched-bench stand-in: records its arguments, prints the jsonl line c392e50's writes with
# --output-format jsonl (its markdown table first, as on stdout there)
BATCHED_STAND_IN = r'''#!{python}
import json, os, sys
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "batched_args"), "a").write(" ".join(sys.argv[1:]) + "\n")
a = sys.argv
pp, tg = int(a[a.index("-npp") + 1]), int(a[a.index("-ntg") + 1])
print("|    PP |     TG |    B |")
print(json.dumps({"n_kv_max": int(a[a.index("-c") + 1]), "n_batch": 2048, "n_ubatch": 512, "flash_attn": 0,
                  "is_pp_shared": 0, "n_gpu_layers": 0, "n_threads": int(a[a.index("-t") + 1]),
                  "n_threads_batch": int(a[a.index("-t") + 1]), "pp": pp, "tg": tg, "pl": 1, "n_kv": pp + tg,
                  "t_pp": 1.0, "speed_pp": 50.0, "t_tg": 1.0, "speed_tg": 7.5, "t": 2.0, "speed": 1.0}))
'''


@pytest.mark.skipif(not os.path.exists(STORIES), reason=f"shared model {STORIES} not found (set WAFER_SHARED)")
def test_depth_without_llama_bench_d(tmp_path):
    """-d with a llama-bench that has no -d (c392e50): decode at depth from the llama-batched-bench beside it."""
    d = tmp_path / "bin"
    d.mkdir()
    lb = d / "llama-bench"
    # the stand-in above has no --help, and no -d: called with either it would fail
    lb.write_text(STAND_IN.replace("{python}", sys.executable, 1).replace(
        "a = sys.argv\n", "a = sys.argv\nif '--help' in a:\n    print('usage: llama-bench [options]'); sys.exit(0)\n"
        "assert '-d' not in a\n", 1))
    lb.chmod(0o755)
    cmd = [sys.executable, os.path.join(REPO, "scripts", "bench_vs_llama.py"), "--wafer", WAFER_BIN,
           "--llama", f"standin={lb}", "-t", "1", "-p", "0", "-n", "8", "-d", "24", "-r", "1", "--rounds", "1",
           "--batch", "1", STORIES]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "llama-batched-bench" in r.stderr  # none beside it yet: says what to build
    bb = d / "llama-batched-bench"
    bb.write_text(BATCHED_STAND_IN.replace("{python}", sys.executable, 1))
    bb.chmod(0o755)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (d / "batched_args").read_text().split() == [
        "-m", STORIES, "-c", "32", "-b", "2048", "-ub", "512", "-npp", "24", "-ntg", "8", "-npl", "1", "-t", "1",
        "--output-format", "jsonl"]
    assert "depth 24" in r.stdout
    lines = r.stdout.splitlines()
    hdr = next(l for l in lines if l.startswith("| model"))
    row = next(l for l in lines if l.startswith("| stories260K.gguf"))
    cells = dict(zip([c.strip() for c in hdr.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["standin tg"] == "7.50" and cells["standin pp"] == "-"
    assert cells["tg wafer/standin"] == f"{float(cells['wafer tg']) / 7.5:.2f}x"
    assert "llama-batched-bench -m MODEL -c 32" in r.stdout  # the commands list names it
